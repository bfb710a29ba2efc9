// torchtrace's backward-pass player: draws the graph Python recorded and steps through its backward.
// One plain script, no dependencies: the saved page and the Jupyter widget both run it as it is, and one page
// may hold several players. Python made every number's text; this file lays out the graph and shows the steps.

const TT_GROUP_AT = 60;  // graphs with more nodes start with their modules collapsed
const TT_BOX_W = 170, TT_BOX_H = 56, TT_COL = 240, TT_GAP = 16, TT_DUMMY_H = 10, TT_BAND_GAP = 70, TT_MARGIN = 48;
let ttPlayers = 0;  // numbers the players of a page (their SVG marker ids must differ)

function ttEscape(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

// What a box says in place of a value it cannot show: the op's value was changed in place afterwards, or is gone.
function ttValueMissing(n) {
  return !n.value_note ? "" : n.value_note.startsWith("changed in place") ? " (changed in place)" : " (value gone)";
}

// Text cut to a width in pixels, as the page draws it in `font` (player.css's fonts): measured on a canvas, so a
// box's text ends inside the box whatever the font's letters are; "…" marks a cut.
const TT_FONTS = {name: "bold 11px system-ui, Helvetica, Arial, sans-serif",
                  data: "11px ui-monospace, Menlo, Consolas, monospace",
                  edge: "10px ui-monospace, Menlo, Consolas, monospace"};
const ttMeasure = {context: null, cache: new Map()};
function ttFit(text, width, font) {
  const key = font + "|" + width + "|" + text;
  if (ttMeasure.cache.has(key)) return ttMeasure.cache.get(key);
  if (!ttMeasure.context) ttMeasure.context = document.createElement("canvas").getContext("2d");
  const c = ttMeasure.context;
  c.font = font;
  let fitted = text;
  if (c.measureText(text).width > width) {
    let low = 0, high = text.length - 1;  // the longest prefix that fits with its "…"
    while (low < high) {
      const mid = Math.ceil((low + high) / 2);
      if (c.measureText(text.slice(0, mid) + "…").width <= width) low = mid; else high = mid - 1;
    }
    fitted = text.slice(0, low) + "…";
  }
  if (ttMeasure.cache.size > 20000) ttMeasure.cache.clear();
  ttMeasure.cache.set(key, fitted);
  return fitted;
}

// Layered layout (a small Sugiyama). Rank = longest path from the output along the gradient edges; an edge that
// spans several ranks passes through one dummy slot per rank in between, so no edge crosses a box. Barycenter
// sweeps order each rank. Ranks become columns, inputs on the left, the output on the right; a long graph wraps
// into bands read left to right, top to bottom, and an edge from one band to the next runs around them.
function ttLayout(ids, links, viewport) {
  const succ = new Map(ids.map((id) => [id, []])), indeg = new Map(ids.map((id) => [id, 0]));
  for (const l of links) { succ.get(l.source).push(l.target); indeg.set(l.target, indeg.get(l.target) + 1); }
  const rank = new Map(ids.map((id) => [id, 0]));
  const queue = ids.filter((id) => indeg.get(id) === 0), seen = new Set();
  for (let q = 0; q < queue.length; q++) {
    const id = queue[q];
    seen.add(id);
    for (const t of succ.get(id)) {
      rank.set(t, Math.max(rank.get(t), rank.get(id) + 1));
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) queue.push(t);
    }
  }
  let top = Math.max(0, ...rank.values());
  for (const id of ids) if (!seen.has(id)) rank.set(id, ++top);  // on a cycle (a module collapsed around a loop)
  const height = new Map(ids.map((id) => [id, TT_BOX_H]));
  const chains = links.map((l, k) => {  // the slots an edge passes through, producer first
    const chain = [l.target];
    const [low, high] = [rank.get(l.source), rank.get(l.target)].sort((a, b) => a - b);
    for (let r = high - 1; r > low; r--) {
      const d = `d${k}:${r}`;
      rank.set(d, r);
      height.set(d, TT_DUMMY_H);
      chain.push(d);
    }
    chain.push(l.source);
    return chain;
  });
  const layers = Array.from({length: top + 1}, () => []);
  for (const [id, r] of rank) layers[r].push(id);
  const up = new Map(), down = new Map();  // neighbours in the rank to the left (producers) and to the right
  const link = (map, a, b) => { if (!map.has(a)) map.set(a, []); map.get(a).push(b); };
  for (const chain of chains) {
    for (let i = 0; i + 1 < chain.length; i++) { link(down, chain[i], chain[i + 1]); link(up, chain[i + 1], chain[i]); }
  }
  const pos = new Map();
  layers.forEach((layer) => layer.forEach((id, i) => pos.set(id, i)));
  for (let sweep = 0; sweep < 6; sweep++) {
    const near = sweep % 2 === 0 ? up : down;  // sweep from the output: order by producers' ... then consumers'
    for (const layer of sweep % 2 === 0 ? layers : [...layers].reverse()) {
      const key = new Map(layer.map((id) => {
        const others = near.get(id) || [];
        return [id, others.length ? others.reduce((s, o) => s + pos.get(o), 0) / others.length : pos.get(id)];
      }));
      layer.sort((a, b) => key.get(a) - key.get(b));
      layer.forEach((id, i) => pos.set(id, i));
    }
  }
  const tall = layers.map((layer) => layer.reduce((s, id) => s + height.get(id) + TT_GAP, -TT_GAP));
  const columns = top + 1, tallest = Math.max(TT_BOX_H, ...tall);
  // A graph that fits the view in one band at 70% or more stays one band; else it wraps into as many bands as make
  // the whole of it fit at the largest scale.
  const fitScale = (bands) => Math.min(viewport.width / (Math.ceil(columns / bands) * TT_COL + 2 * TT_MARGIN),
                                       viewport.height / (bands * (tallest + TT_BAND_GAP) + TT_MARGIN));
  const readable = (k) => Math.min(1, fitScale(k));
  let bands = 1;
  if (readable(1) < 0.7) for (let k = 2; k <= columns; k++) if (readable(k) > readable(bands) * 1.05) bands = k;
  const perBand = Math.ceil(columns / bands);
  const bandOf = (r) => Math.floor((top - r) / perBand), bandCount = bandOf(0) + 1;
  const bandHeight = Array(bandCount).fill(0);
  layers.forEach((_, r) => { bandHeight[bandOf(r)] = Math.max(bandHeight[bandOf(r)], tall[r]); });
  const bandTop = [TT_MARGIN];
  for (let b = 1; b < bandCount; b++) bandTop[b] = bandTop[b - 1] + bandHeight[b - 1] + TT_BAND_GAP;
  const xy = new Map();
  layers.forEach((layer, r) => {
    const b = bandOf(r);
    let y = bandTop[b] + (bandHeight[b] - tall[r]) / 2;
    for (const id of layer) {
      xy.set(id, {x: TT_MARGIN + ((top - r) % perBand) * TT_COL, y, h: height.get(id)});
      y += height.get(id) + TT_GAP;
    }
  });
  const right = TT_MARGIN + (perBand - 1) * TT_COL + TT_BOX_W;
  let lane = 0;
  const paths = chains.map((chain) => {  // producer -> consumer
    let d = "", label = null;
    for (let i = 0; i + 1 < chain.length; i++) {
      const a = xy.get(chain[i]), b = xy.get(chain[i + 1]);
      const x1 = a.x + TT_BOX_W, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2;
      if (i === 0) d += `M${x1},${y1}`;
      if (x2 > x1) {
        d += ` C${x1 + 30},${y1} ${x2 - 30},${y2} ${x2},${y2}`;
      } else {  // into the next band: out to the right, along the gap below this band, in from the left
        const off = (lane++ % 10) * 4, gap = bandTop[bandOf(rank.get(chain[i]))] + bandHeight[bandOf(rank.get(chain[i]))];
        const yc = gap + TT_BAND_GAP / 2 - 18 + off, xr = right + 14 + off, xl = TT_MARGIN - 14 - off;
        d += ` L${xr},${y1} L${xr},${yc} L${xl},${yc} L${xl},${y2} L${x2},${y2}`;
      }
      if (i + 2 === chain.length) {  // the label sits between the columns, or on the run along the band gap
        label = x2 > x1 ? {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, w: x2 - x1 - 10} :
          {x: TT_MARGIN + TT_BOX_W / 2 + ((lane - 1) % perBand) * TT_COL, w: TT_COL - 10,  // a column each
           y: bandTop[bandOf(rank.get(chain[i]))] + bandHeight[bandOf(rank.get(chain[i]))] + TT_BAND_GAP / 2 - 22 +
             (lane - 1) % 10 * 4};
      }
      if (i + 1 < chain.length - 1) d += ` L${b.x + TT_BOX_W},${y2}`;  // straight through a dummy's column
    }
    return {d, label};
  });
  const bottom = bandTop[bandCount - 1] + bandHeight[bandCount - 1];
  return {xy, paths, width: right + TT_MARGIN, height: bottom + TT_MARGIN};
}

// One player in `container`. options.nav replaces its own stepping (two players stepping together);
// options.onPick(step) is told when a node is clicked; options.fitFrom: the smallest scale at which the graph opens
// whole (else it opens at a readable scale around the current step).
function torchtracePlayer(container, data, options) {
  options = options || {};
  const uid = ++ttPlayers;
  const root = document.createElement("div");  // drawn afresh on every call: no listener is added twice
  container.replaceChildren(root);
  const steps = data.steps, nodes = data.nodes, edges = data.edges, findings = data.findings || [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const stepOf = new Map(steps.map((s) => [s.node, s.index]));
  const found = new Map();  // node id -> its findings
  for (const f of findings) { if (!found.has(f.node)) found.set(f.node, []); found.get(f.node).push(f); }
  const modules = new Set();
  for (const n of nodes) {
    const parts = n.module ? n.module.split(".") : [];
    for (let i = 1; i <= parts.length; i++) modules.add(parts.slice(0, i).join("."));
  }
  const state = {step: 0, values: true, playing: null, diagnosis: true, matches: [], match: -1,
                 expanded: new Set(nodes.length > TT_GROUP_AT ? [] : modules), zoom: {k: 1, x: 0, y: 0}};

  root.classList.add("tt-player");
  root.tabIndex = 0;
  root.innerHTML = `
    <div class="tt-bar">
      <button data-act="first" title="first step (Home)">«</button>
      <button data-act="prev" title="previous step (←)">←</button>
      <button data-act="play" title="play / pause (space)">▶</button>
      <button data-act="next" title="next step (→)">→</button>
      <button data-act="last" title="last step (End)">»</button>
      <span class="tt-count"></span>
      <button data-act="values" title="show values or shapes">shapes</button>
      <span class="tt-sep"></span>
      <button data-act="fit" title="fit the graph to the view (f)">fit</button>
      <button data-act="zoomIn" title="zoom in (+; or the mouse wheel)">+</button>
      <button data-act="zoomOut" title="zoom out (-)">−</button>
      <button data-act="expand" title="expand every module">expand all</button>
      <button data-act="collapse" title="one box per top-level module">collapse modules</button>
      <button data-act="diagnosis" title="show or hide the findings">diagnosis</button>
      <input class="tt-search" type="search" placeholder="search names (/)" title="Enter: next match">
      <span class="tt-found"></span>
    </div>
    <p class="tt-notice"></p>
    <div class="tt-main"><div class="tt-graph"></div><div class="tt-panel"></div></div>`;
  const graph = root.querySelector(".tt-graph"), panel = root.querySelector(".tt-panel");
  const search = root.querySelector(".tt-search");
  const notice = root.querySelector(".tt-notice");
  notice.textContent = data.notice || "";
  notice.style.display = data.notice ? "" : "none";
  const diagnosisButton = root.querySelector('[data-act="diagnosis"]');
  diagnosisButton.style.display = findings.length ? "" : "none";
  diagnosisButton.textContent = `diagnosis (${findings.length})`;
  const hasModules = modules.size > 0;
  for (const act of ["expand", "collapse"]) root.querySelector(`[data-act="${act}"]`).style.display = hasModules ? "" : "none";

  const groupOf = (node) => {  // the collapsed module that hides `node`, or null
    const parts = node.module ? node.module.split(".") : [];
    for (let i = 1; i <= parts.length; i++) {
      const prefix = parts.slice(0, i).join(".");
      if (!state.expanded.has(prefix)) return prefix;
    }
    return null;
  };
  const visibleId = (node) => { const g = groupOf(node); return g === null ? node.id : "g:" + g; };

  let view = null;
  function render() {
    const shown = new Map();  // visible id -> the nodes inside it
    for (const n of nodes) {
      const v = visibleId(n);
      if (!shown.has(v)) shown.set(v, []);
      shown.get(v).push(n);
    }
    const links = new Map();  // "source>target" -> the recorded edges it stands for
    edges.forEach((e, i) => {
      const s = visibleId(byId.get(e.source)), t = visibleId(byId.get(e.target));
      if (s === t) return;
      const key = s + ">" + t + (s.startsWith("g:") || t.startsWith("g:") ? "" : ">" + i);
      if (!links.has(key)) links.set(key, {source: s, target: t, edges: []});
      links.get(key).edges.push(e);
    });
    const ids = [...shown.keys()], linkList = [...links.values()];
    const box = graph.getBoundingClientRect();
    const lay = ttLayout(ids, linkList, box.width > 0 && box.height > 0 ? box : {width: 1200, height: 460});
    const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="100%" height="100%">`,
      `<defs><marker id="tt-arrow-${uid}" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" markerHeight="9"
        orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker>
        <clipPath id="tt-clip-${uid}"><rect x="2" y="0" width="${TT_BOX_W - 4}" height="${TT_BOX_H}"/></clipPath></defs>
        <g class="tt-zoom">`];
    let k = 0;
    for (const [key, l] of links) {
      const p = lay.paths[k++];
      parts.push(`<g class="tt-edge" data-link="${ttEscape(key)}" data-width="${p.label.w}"><title></title>` +
                 `<path d="${p.d}" marker-start="url(#tt-arrow-${uid})"/><text x="${p.label.x}" y="${p.label.y}"></text></g>`);
    }
    for (const [id, inside] of shown) {
      const {x, y} = lay.xy.get(id);
      const group = id.startsWith("g:"), n = inside[0];
      const kind = group ? "group" : n.kind;
      let title, tip;
      if (group) {
        const path = id.slice(2), what = (data.modules || {})[path];
        title = path + (what ? ` · ${what}` : "");
        tip = `${title}: ${inside.length} nodes (click to expand)`;
      } else {
        title = n.label;
        tip = n.label + (n.module ? " in " + n.module : "") + (n.value_note ? "\n" + n.value_note : "");
      }
      const marks = inside.flatMap((m) => found.get(m.id) || []);
      if (marks.length) tip += "\n" + marks.map((f) => `${f.severity}: ${f.message}`).join("\n");
      const worst = ["error", "warn", "info"].find((s) => marks.some((f) => f.severity === s));
      const badge = marks.length ? `<g class="tt-badge tt-${worst}"><circle cx="${TT_BOX_W - 8}" cy="8" r="8"/>` +
        `<text x="${TT_BOX_W - 8}" y="12">${marks.length > 1 ? marks.length : "!"}</text></g>` : "";
      const room = TT_BOX_W - 16 - (marks.length ? 16 : 0);  // the badge takes the top right corner
      parts.push(`<g class="tt-node tt-${kind}" data-id="${ttEscape(id)}" transform="translate(${x},${y})">
        <title>${ttEscape(tip)}</title><rect width="${TT_BOX_W}" height="${TT_BOX_H}" rx="6"/>
        <g clip-path="url(#tt-clip-${uid})"><text class="tt-name" x="8" y="16">${ttEscape(ttFit(title, room, TT_FONTS.name))}</text>
        <text class="tt-data" x="8" y="33"></text><text class="tt-grad" x="8" y="49"></text></g>${badge}</g>`);
    }
    parts.push("</g></svg>");
    graph.innerHTML = parts.join("");
    graph.classList.toggle("tt-diagnosis-off", !state.diagnosis);
    const elements = new Map([...graph.querySelectorAll(".tt-node")].map((el) => [el.dataset.id, el]));
    const edgeEls = [...graph.querySelectorAll(".tt-edge")].map((el) => ({el, link: links.get(el.dataset.link)}));
    view = {shown, links, lay, elements, edgeEls, shownText: new Map(), zoomed: graph.querySelector(".tt-zoom")};
    for (const [id, el] of elements) {
      el.addEventListener("click", (event) => {
        event.stopPropagation();
        if (id.startsWith("g:")) { open(id.slice(2), view.shown.get(id).length); return; }
        if (stepOf.has(id)) pick(stepOf.get(id));
      });
    }
    markMatches();
    update();
  }

  // ------------------------------------------------------------------------------------- zoom and pan
  function applyZoom() {
    const z = state.zoom;
    view.zoomed.setAttribute("transform", `translate(${z.x},${z.y}) scale(${z.k})`);
  }
  function zoomBy(factor, cx, cy) {
    const z = state.zoom, k = Math.min(3, Math.max(0.03, z.k * factor));
    if (cx === undefined) { const box = graph.getBoundingClientRect(); cx = box.width / 2; cy = box.height / 2; }
    z.x = cx - (cx - z.x) * (k / z.k);
    z.y = cy - (cy - z.y) * (k / z.k);
    z.k = k;
    applyZoom();
  }
  function fit() {
    const box = graph.getBoundingClientRect();
    if (!box.width || !box.height) return;
    const k = Math.min(1, box.width / view.lay.width, box.height / view.lay.height);
    state.zoom = {k, x: (box.width - view.lay.width * k) / 2, y: (box.height - view.lay.height * k) / 2};
    applyZoom();
  }
  function centre(id, onlyIfHidden) {  // pan so that the box `id` is in the middle of the view
    const at = id && view.lay.xy.get(id), box = graph.getBoundingClientRect();
    if (!at || !box.width) return;
    const z = state.zoom, sx = z.x + (at.x + TT_BOX_W / 2) * z.k, sy = z.y + (at.y + TT_BOX_H / 2) * z.k;
    const margin = 30;
    if (onlyIfHidden && sx > margin && sx < box.width - margin && sy > margin && sy < box.height - margin) return;
    z.x += box.width / 2 - sx;
    z.y += box.height / 2 - sy;
    applyZoom();
  }
  function firstVisibleOf(path) {
    for (const [id, inside] of view.shown) if (inside.some((n) => n.module === path || n.module.startsWith(path + "."))) return id;
    return null;
  }
  function relayout() {  // lay out again for the view's present size (the layout wraps to fit it)
    render();
    initialView();
  }
  function initialView() {
    let box = graph.getBoundingClientRect();
    if (!state.sized && box.width && view.lay.width <= box.width && view.lay.height + 8 < box.height) {
      graph.style.height = `${Math.max(160, view.lay.height + 8)}px`;  // a small graph takes only the room it needs
      box = graph.getBoundingClientRect();
    }
    state.sized = true;
    const k = box.width ? Math.min(box.width / view.lay.width, box.height / view.lay.height) : 1;
    if (k >= (options.fitFrom || 0.55)) { fit(); return; }  // whole, when it is still readable so
    state.zoom = {k: 0.8, x: 0, y: 0};
    applyZoom();
    centre(currentBox());
  }
  if (typeof ResizeObserver !== "undefined") {  // a view nobody zoomed or panned follows the page's size
    let last = graph.getBoundingClientRect().width;  // as laid out: only a change of width lays out again
    new ResizeObserver(() => {
      const width = graph.getBoundingClientRect().width;
      if (!state.touched && view && width && Math.abs(width - last) > 1) { last = width; relayout(); }
    }).observe(graph);
  }
  graph.addEventListener("wheel", (event) => {
    event.preventDefault();
    state.touched = true;
    const box = graph.getBoundingClientRect();
    zoomBy(Math.exp(-event.deltaY * 0.0015), event.clientX - box.left, event.clientY - box.top);
  }, {passive: false});
  let drag = null;
  graph.addEventListener("pointerdown", (event) => {
    if (event.button !== 0 || event.target.closest(".tt-node")) return;
    drag = {x: event.clientX, y: event.clientY, zx: state.zoom.x, zy: state.zoom.y};
    state.touched = true;
    graph.setPointerCapture(event.pointerId);
    graph.classList.add("tt-dragging");
  });
  graph.addEventListener("pointermove", (event) => {
    if (!drag) return;
    state.zoom.x = drag.zx + event.clientX - drag.x;
    state.zoom.y = drag.zy + event.clientY - drag.y;
    applyZoom();
  });
  const endDrag = () => { drag = null; graph.classList.remove("tt-dragging"); };
  graph.addEventListener("pointerup", endDrag);
  graph.addEventListener("pointercancel", endDrag);

  // ------------------------------------------------------------------------------------------ search
  function expandTo(path) {
    const parts = path ? path.split(".") : [];
    for (let i = 1; i <= parts.length; i++) state.expanded.add(parts.slice(0, i).join("."));
  }
  function open(path, size) {  // a module clicked: shown inside, with its sub-modules too when it is small
    expandTo(path);
    if (size <= TT_GROUP_AT) for (const m of modules) if (m.startsWith(path + ".")) state.expanded.add(m);
    render();
    centre(firstVisibleOf(path));
  }
  function markMatches() {
    const hit = new Set(state.matches.map((n) => visibleId(n)));
    for (const [id, el] of view.elements) el.classList.toggle("tt-match", hit.has(id));
    const count = root.querySelector(".tt-found");
    count.textContent = search.value ? (state.matches.length ?
      `${state.match >= 0 ? state.match + 1 + " / " : ""}${state.matches.length} found` : "not found") : "";
  }
  function find(query) {
    const q = query.trim().toLowerCase();
    const kinds = data.modules || {};  // a module's class name: "Residual" finds the boxes of every Residual block
    const hit = (n) => n.label.toLowerCase().includes(q) || n.module.toLowerCase().includes(q) ||
      (kinds[n.module] || "").toLowerCase().includes(q);
    state.matches = q ? nodes.filter(hit) : [];
    state.match = -1;
    markMatches();
  }
  function nextMatch() {
    if (!state.matches.length) return;
    state.match = (state.match + 1) % state.matches.length;
    const n = state.matches[state.match];
    if (groupOf(n) !== null) { expandTo(n.module); render(); }
    if (stepOf.has(n.id)) pick(stepOf.get(n.id));
    markMatches();
    const el = view.elements.get(n.id);
    for (const other of graph.querySelectorAll(".tt-focus")) other.classList.remove("tt-focus");
    if (el) el.classList.add("tt-focus");
    centre(n.id);
  }
  search.addEventListener("input", () => find(search.value));
  search.addEventListener("keydown", (event) => {
    event.stopPropagation();  // typing is not stepping
    if (event.key === "Enter") { event.preventDefault(); nextMatch(); }
    if (event.key === "Escape") { search.value = ""; find(""); root.focus(); }
  });

  // ------------------------------------------------------------------------------------- the steps
  function nodeGrad(n) {
    const i = stepOf.get(n.id);
    if (i === undefined || i > state.step) return "";
    const s = steps[i];
    return s.kind === "accumulate" ? s.after : s.upstream;
  }
  function setText(el, key, text) {  // writes the page only where something changed (a 1,000-node graph)
    const cacheKey = el.dataset.id + key;
    if (view.shownText.get(cacheKey) === text) return;
    view.shownText.set(cacheKey, text);
    el.querySelector(key).textContent = text;
  }
  function currentBox() {
    const current = steps[state.step];
    return current ? visibleId(byId.get(current.node)) : null;
  }

  function update() {
    const current = steps[state.step], here = currentBox();
    root.querySelector(".tt-count").textContent = steps.length ? `step ${state.step + 1} / ${steps.length}` : "no steps";
    root.querySelector('[data-act="values"]').textContent = state.values ? "shapes" : "values";
    for (const [id, el] of view.elements) {
      const inside = view.shown.get(id), group = id.startsWith("g:"), n = inside[0];
      el.classList.toggle("tt-current", id === here);
      let done = 0;
      for (const m of inside) if (stepOf.has(m.id) && stepOf.get(m.id) <= state.step) done++;
      el.classList.toggle("tt-done", done === inside.length);
      const dataText = group ? `${inside.length} nodes, ${done} stepped` :
        state.values && n.value ? "data " + n.value : n.shape + (state.values ? ttValueMissing(n) : "");
      setText(el, ".tt-data", ttFit(dataText, TT_BOX_W - 16, TT_FONTS.data));
      const grad = group ? "" : nodeGrad(n);
      setText(el, ".tt-grad", grad ? ttFit("grad " + grad, TT_BOX_W - 16, TT_FONTS.data) : "");
    }
    for (const {el, link} of view.edgeEls) {
      let carried = 0, label = "", now = false;
      for (const e of link.edges) {
        if (e.step >= 0 && e.step <= state.step) { carried++; label = e.gradient; }
        if (current && e.step === current.index) now = true;
      }
      el.classList.toggle("tt-carried", carried > 0);
      el.classList.toggle("tt-now", now);
      const text = carried === 1 ? label : carried > 1 ? `${carried} gradients` : "";
      if (el.dataset.shown !== text) {
        el.dataset.shown = text;
        el.querySelector("text").textContent = ttFit(text, +el.dataset.width, TT_FONTS.edge);
        el.querySelector("title").textContent = text;  // the whole of it, on hover
      }
    }
    panel.innerHTML = current ? describe(current) : "<p>Nothing to step through: no gradient reached any node.</p>";
    const check = panel.querySelector(".tt-check-button");
    if (check) {
      check.addEventListener("click", () => {
        state.checks = !state.checks;  // stays open from step to step, and when the graph is laid out again
        panel.querySelector(".tt-checks").classList.toggle("tt-open", state.checks);
      });
    }
    centre(here, true);
    if (options.onUpdate) options.onUpdate(state.step);
  }

  function describe(s) {
    const e = ttEscape;
    let html = `<h3>step ${s.index + 1}: ${e(s.name)}${s.module ? ` <small>in ${e(s.module)}</small>` : ""}</h3>`;
    if (state.diagnosis && found.has(s.node)) {
      html += found.get(s.node).map((f) =>
        `<p class="tt-finding tt-${e(f.severity)}"><b>${e(f.severity)} · ${e(f.kind)}</b>: ${e(f.message)}</p>`).join("");
    }
    const sent = s.parts.map(([who, g]) => `${e(g)} <small>(from ${e(who)})</small>`);
    const parts = s.gathered ? " — one per output: " + sent.join("; ") : sent.length > 1 ? " = " + sent.join(" + ") : "";
    const note = s.note ? `<p class="tt-note">${e(s.note)}</p>` : "";
    const node = byId.get(s.node);
    const value = (node && node.value ? `<p>value: <b class="tt-value">${e(node.value)}</b></p>` : "") +
      (node && node.value_note ? `<p class="tt-note">value: ${e(node.value_note)}</p>` : "");
    if (s.kind === "accumulate") {
      html += `<p class="tt-math">⊕ the gradients that reached this leaf are added into its .grad</p>${value}`;
      html += `<p>gradient reaching it: <b class="tt-up">${e(s.upstream)}</b>${parts}</p>`;
      const sum = s.before === "—" ? "" : `${e(s.before)} + ${e(s.upstream)} = `;  // no .grad before: it is the gradient
      html += `<p class="tt-acc">${e(s.name)}.grad = ${sum}<b class="tt-after">${e(s.after)}</b></p>`;
      return html + note;
    }
    if (s.math) html += `<p class="tt-math">${e(s.math)}</p>`;
    html += value + `<p>upstream gradient: <b class="tt-up">${e(s.upstream)}</b>${parts}</p>${note}`;
    if (s.saved.length) {
      html += "<p>saved for backward: " + s.saved.map(([w, v]) => `<i>${e(w)}</i> = ${e(v)}`).join("; ") + "</p>";
    }
    html += `<table class="tt-chain"><tr><th>to</th><th>local derivative</th><th>downstream gradient</th></tr>`;
    for (const out of s.sent) {
      const l = out.local;
      const shape = l && l.shape !== "d out () / d input ()" ? ` <small>${e(l.shape)}</small>` : "";  // not for numbers
      const local = l ? `<span class="tt-kind">${e(l.kind)}</span>${shape}<br>` +
        `<span class="tt-local">${e(l.text)}</span>${l.how ? `<br><small>${e(l.how)}</small>` : ""}` :
        `<small>${e(out.local_why || "see the math line")}</small>`;
      html += `<tr><td>${e(out.input)}</td><td>${local}</td><td><b class="tt-down" data-to="${e(out.to)}">${e(out.gradient)}</b></td></tr>`;
    }
    html += "</table>";
    if (s.sent.some((o) => o.check)) {
      html += `<button class="tt-check-button">check this step</button><div class="tt-checks${state.checks ? " tt-open" : ""}">`;
      for (const out of s.sent) {
        if (!out.check) continue;
        const c = out.check;
        html += c.estimate === null ? `<p>${e(out.input)}: not checked: ${e(c.why_not)}</p>` :
          `<p>${e(out.input)}: rule <b>${e(c.rule)}</b>, finite differences <b>${e(c.estimate)}</b>: ` +
          `<span class="${c.agrees ? "tt-ok" : "tt-bad"}">${c.agrees ? "agree" : "DIFFER"}</span> ` +
          `<small>(${e(c.detail)})</small></p>`;
      }
      html += "</div>";
    }
    return html;
  }

  function go(i) {
    state.step = Math.max(0, Math.min(steps.length - 1, i));
    update();
  }
  function pick(i) {
    if (options.onPick) options.onPick(i); else go(i);
  }

  function play() {
    if (state.playing) { clearInterval(state.playing); state.playing = null; }
    else {
      if (nav.atEnd()) nav.first();
      state.playing = setInterval(() => {
        if (nav.atEnd()) { play(); return; }
        nav.next();
      }, 900);
    }
    root.querySelector('[data-act="play"]').textContent = state.playing ? "⏸" : "▶";
  }

  const nav = options.nav || {
    first: () => go(0), prev: () => go(state.step - 1), next: () => go(state.step + 1), last: () => go(steps.length - 1),
    atEnd: () => state.step >= steps.length - 1,
  };
  const actions = {
    first: () => nav.first(), prev: () => nav.prev(), next: () => nav.next(), last: () => nav.last(), play,
    values: () => { state.values = !state.values; update(); },
    expand: () => { state.expanded = new Set(modules); render(); centre(currentBox()); },
    collapse: () => { state.expanded = new Set(); render(); centre(currentBox()); },
    fit: () => { state.touched = true; fit(); },
    zoomIn: () => { state.touched = true; zoomBy(1.25); }, zoomOut: () => { state.touched = true; zoomBy(0.8); },
    diagnosis: () => { state.diagnosis = !state.diagnosis; graph.classList.toggle("tt-diagnosis-off", !state.diagnosis); update(); },
    search: () => search.focus(),
  };
  for (const button of root.querySelectorAll(".tt-bar button")) {
    button.addEventListener("click", () => actions[button.dataset.act]());
  }
  const KEYS = {ArrowRight: "next", ArrowLeft: "prev", " ": "play", Home: "first", End: "last", f: "fit",
                "+": "zoomIn", "=": "zoomIn", "-": "zoomOut", "/": "search"};
  function key(event) {  // true when the key was the player's
    const act = KEYS[event.key];
    if (!act || event.ctrlKey || event.metaKey || event.altKey) return false;
    event.preventDefault();
    actions[act]();
    return true;
  }
  root.addEventListener("keydown", (event) => { if (key(event)) event.stopPropagation(); });  // not Jupyter's shortcuts
  render();
  initialView();
  return {go, state, key, root, relayout, focus: () => root.focus({preventScroll: true}), steps: steps.length,
          render, fit, find: (q) => { search.value = q; find(q); }, nextMatch};
}

// Two players stepping together along `pairs` of (step in the first, step in the second).
function torchtraceSideBySide(container, both) {
  container.replaceChildren();
  container.classList.add("tt-pair-page");
  const bar = document.createElement("div");
  bar.className = "tt-pair-bar";
  const row = document.createElement("div");
  row.className = "tt-pair-row";
  container.append(bar, row);
  const pairs = both.pairs, first = both.first === null || both.first === undefined ? 0 : both.first;
  let at = first;
  const players = [];
  const show = () => {
    players.forEach((p, side) => p.go(pairs[at][side]));
    const marked = at === both.first;
    bar.innerHTML = `<span class="tt-count">pair ${at + 1} / ${pairs.length}</span> ` +
      (both.first !== null && both.first !== undefined ? `<button class="tt-to-first">go to pair ${both.first + 1}</button>` : "") +
      (marked ? ` <b class="tt-highlight">highlighted pair</b>` : "");
    bar.classList.toggle("tt-highlighted", marked);
    row.classList.toggle("tt-highlighted", marked);
    const back = bar.querySelector(".tt-to-first");
    if (back) back.addEventListener("click", () => { at = both.first; show(); });
  };
  const nav = {
    first: () => { at = 0; show(); }, prev: () => { at = Math.max(0, at - 1); show(); },
    next: () => { at = Math.min(pairs.length - 1, at + 1); show(); }, last: () => { at = pairs.length - 1; show(); },
    atEnd: () => at >= pairs.length - 1,
  };
  both.players.forEach((data, side) => {
    const cell = document.createElement("div");
    cell.className = "tt-pair-cell";
    const title = document.createElement("h2");
    title.textContent = both.titles[side];
    const holder = document.createElement("div");
    cell.append(title, holder);
    row.append(cell);
    const onPick = (step) => {  // the pair that holds this step (on this side), else the nearest after it
      let best = pairs.findIndex((p) => p[side] === step);
      if (best < 0) best = pairs.findIndex((p) => p[side] > step);
      if (best >= 0) { at = best; show(); } else players[side].go(step);
    };
    players.push(torchtracePlayer(holder, data, {nav, onPick, fitFrom: 0.3}));  // half a window: open whole
  });
  players.forEach((p) => p.relayout());  // both cells have their widths now
  show();
  return {players, key: (event) => players[0].key(event), focus: () => players[0].focus(), go: (i) => { at = i; show(); }};
}

// A saved page: the player (or the two), focused, and the arrow keys working before anything is clicked.
function torchtracePage(container, data) {
  const shown = data.players ? torchtraceSideBySide(container, data) : torchtracePlayer(container, data);
  shown.focus();
  document.addEventListener("keydown", (event) => {
    const t = event.target;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.isContentEditable)) return;
    if (t && t.closest && t.closest(".tt-player")) return;  // the player handled it
    shown.key(event);
  });
  return shown;
}
