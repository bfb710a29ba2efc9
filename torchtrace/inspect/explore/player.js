// torchtrace's backward-pass player: draws the graph Python recorded and steps through its backward.
// One plain script, no dependencies: the saved page and the Jupyter widget both run it as it is.
// Python made every number's text; this file only lays out the graph and shows the steps.

const TT_GROUP_AT = 60;  // graphs with more nodes start with their modules collapsed
const TT_COL = 250, TT_ROW = 74, TT_BOX_W = 160, TT_BOX_H = 54;

function ttEscape(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

function ttShort(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

// Layered layout (a small Sugiyama): rank = longest path from the output along the gradient edges,
// then a few barycenter sweeps to order each rank, then one column per rank (output on the right).
function ttLayout(ids, edges) {
  const succ = new Map(ids.map((id) => [id, []])), indeg = new Map(ids.map((id) => [id, 0]));
  for (const e of edges) { succ.get(e.source).push(e.target); indeg.set(e.target, indeg.get(e.target) + 1); }
  const rank = new Map(ids.map((id) => [id, 0])), queue = ids.filter((id) => indeg.get(id) === 0);
  const seen = new Set();
  while (queue.length) {
    const id = queue.shift();
    seen.add(id);
    for (const t of succ.get(id)) {
      rank.set(t, Math.max(rank.get(t), rank.get(id) + 1));
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) queue.push(t);
    }
  }
  let top = Math.max(0, ...rank.values());
  for (const id of ids) if (!seen.has(id)) rank.set(id, ++top);  // on a cycle (a module collapsed around a loop)
  const layers = [];
  for (const id of ids) (layers[rank.get(id)] = layers[rank.get(id)] || []).push(id);
  const pos = new Map();
  const place = () => layers.forEach((layer) => layer && layer.forEach((id, i) => pos.set(id, i - layer.length / 2)));
  place();
  const pred = new Map(ids.map((id) => [id, []]));
  for (const e of edges) pred.get(e.target).push(e.source);
  for (let sweep = 0; sweep < 4; sweep++) {
    const near = sweep % 2 === 0 ? pred : succ;
    for (const layer of sweep % 2 === 0 ? layers : [...layers].reverse()) {
      if (!layer) continue;
      const centre = (id) => {
        const others = near.get(id);
        return others.length ? others.reduce((s, o) => s + pos.get(o), 0) / others.length : pos.get(id);
      };
      const key = new Map(layer.map((id) => [id, centre(id)]));
      layer.sort((a, b) => key.get(a) - key.get(b));
      layer.forEach((id, i) => pos.set(id, i - layer.length / 2));
    }
  }
  const tallest = Math.max(1, ...layers.map((l) => (l ? l.length : 0)));
  const xy = new Map();
  for (const id of ids) {
    xy.set(id, {x: 20 + (top - rank.get(id)) * TT_COL, y: 20 + (pos.get(id) + tallest / 2) * TT_ROW});
  }
  return {xy, width: 40 + (top + 1) * TT_COL, height: 40 + tallest * TT_ROW};
}

function torchtracePlayer(container, data) {
  const root = document.createElement("div");  // drawn afresh on every call: no listener is added twice
  container.replaceChildren(root);
  const steps = data.steps, nodes = data.nodes, edges = data.edges;
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const stepOf = new Map(steps.map((s) => [s.node, s.index]));
  const modules = new Set();
  for (const n of nodes) {
    const parts = n.module ? n.module.split(".") : [];
    for (let i = 1; i <= parts.length; i++) modules.add(parts.slice(0, i).join("."));
  }
  const state = {step: 0, values: true, playing: null,
                 expanded: new Set(nodes.length > TT_GROUP_AT ? [] : modules)};

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
      <button data-act="expand" title="expand every module">expand all</button>
      <button data-act="collapse" title="one box per top-level module">collapse modules</button>
    </div>
    <div class="tt-main"><div class="tt-graph"></div><div class="tt-panel"></div></div>`;
  const graph = root.querySelector(".tt-graph"), panel = root.querySelector(".tt-panel");

  const visibleId = (node) => {
    const parts = node.module ? node.module.split(".") : [];
    for (let i = 1; i <= parts.length; i++) {
      const prefix = parts.slice(0, i).join(".");
      if (!state.expanded.has(prefix)) return "g:" + prefix;
    }
    return node.id;
  };

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
    const ids = [...shown.keys()];
    const lay = ttLayout(ids, [...links.values()]);
    let svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${lay.width}" height="${lay.height}">`;
    svg += `<defs><marker id="tt-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"
      orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>`;
    let k = 0;
    for (const [key, link] of links) {
      const a = lay.xy.get(link.source), b = lay.xy.get(link.target);
      const x1 = a.x, y1 = a.y + TT_BOX_H / 2, x2 = b.x + TT_BOX_W, y2 = b.y + TT_BOX_H / 2;
      const bend = (k++ % 3 - 1) * 8;
      svg += `<g class="tt-edge" data-link="${ttEscape(key)}">
        <path d="M${x1},${y1} C${x1 - 50},${y1 + bend} ${x2 + 50},${y2 + bend} ${x2},${y2}" marker-end="url(#tt-arrow)"/>
        <text x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 - 4 + bend}"></text></g>`;
    }
    for (const [id, inside] of shown) {
      const {x, y} = lay.xy.get(id);
      const group = id.startsWith("g:");
      const n = inside[0];
      const kind = group ? "group" : n.kind;
      const title = group ? `${id.slice(2)} (${inside.length} nodes)` :
        n.label + (n.module && n.kind !== "leaf" ? ` · ${n.module}` : "");
      svg += `<g class="tt-node tt-${kind}" data-id="${ttEscape(id)}" transform="translate(${x},${y})">
        <title>${ttEscape(group ? title + ": click to expand" : n.label + (n.module ? " in " + n.module : ""))}</title>
        <rect width="${TT_BOX_W}" height="${TT_BOX_H}" rx="6"/>
        <text class="tt-name" x="8" y="16">${ttEscape(ttShort(title, 24))}</text>
        <text class="tt-data" x="8" y="32"></text><text class="tt-grad" x="8" y="47"></text></g>`;
    }
    svg += "</svg>";
    graph.innerHTML = svg;
    view = {shown, links};
    for (const el of graph.querySelectorAll(".tt-node")) {
      el.addEventListener("click", () => {
        const id = el.dataset.id;
        if (id.startsWith("g:")) { state.expanded.add(id.slice(2)); render(); return; }
        if (stepOf.has(id)) go(stepOf.get(id));
      });
    }
    update();
  }

  function nodeGrad(n) {
    const i = stepOf.get(n.id);
    if (i === undefined || i > state.step) return "";
    const s = steps[i];
    return s.kind === "accumulate" ? s.after : s.upstream;
  }

  function update() {
    const current = steps[state.step];
    root.querySelector(".tt-count").textContent = steps.length ? `step ${state.step + 1} / ${steps.length}` : "no steps";
    root.querySelector('[data-act="values"]').textContent = state.values ? "shapes" : "values";
    for (const el of graph.querySelectorAll(".tt-node")) {
      const inside = view.shown.get(el.dataset.id);
      const group = el.dataset.id.startsWith("g:");
      const n = inside[0];
      el.classList.toggle("tt-current", !!current && inside.some((m) => m.id === current.node));
      el.classList.toggle("tt-done", inside.every((m) => stepOf.has(m.id) && stepOf.get(m.id) <= state.step));
      const dataText = group ? `${inside.length} nodes` : state.values && n.value ? "data " + n.value : n.shape;
      el.querySelector(".tt-data").textContent = ttShort(dataText, 26);
      const grad = group ? "" : nodeGrad(n);
      el.querySelector(".tt-grad").textContent = grad ? ttShort("grad " + grad, 26) : "";
    }
    for (const el of graph.querySelectorAll(".tt-edge")) {
      const link = view.links.get(el.dataset.link);
      const carried = link.edges.filter((e) => e.step >= 0 && e.step <= state.step);
      el.classList.toggle("tt-carried", carried.length > 0);
      el.classList.toggle("tt-now", !!current && link.edges.some((e) => e.step === current.index));
      const label = carried.length === 1 ? carried[0].gradient : carried.length > 1 ? `${carried.length} gradients` : "";
      el.querySelector("text").textContent = ttShort(label, 24);
    }
    panel.innerHTML = current ? describe(current) : "<p>Nothing to step through: no gradient reached any node.</p>";
    const check = panel.querySelector(".tt-check-button");
    if (check) check.addEventListener("click", () => panel.querySelector(".tt-checks").classList.toggle("tt-open"));
    const cur = graph.querySelector(".tt-current");
    if (cur && cur.scrollIntoView) cur.scrollIntoView({block: "nearest", inline: "nearest"});
  }

  function describe(s) {
    const e = ttEscape;
    let html = `<h3>step ${s.index + 1}: ${e(s.name)}${s.module ? ` <small>in ${e(s.module)}</small>` : ""}</h3>`;
    const sent = s.parts.map(([who, g]) => `${e(g)} <small>(from ${e(who)})</small>`);
    const parts = s.gathered ? " — one per output: " + sent.join("; ") : sent.length > 1 ? " = " + sent.join(" + ") : "";
    const note = s.note ? `<p class="tt-note">${e(s.note)}</p>` : "";
    if (s.kind === "accumulate") {
      html += `<p class="tt-math">⊕ the gradients that reached this leaf are added into its .grad</p>`;
      html += `<p>gradient reaching it: <b class="tt-up">${e(s.upstream)}</b>${parts}</p>`;
      const sum = s.before === "—" ? "" : `${e(s.before)} + ${e(s.upstream)} = `;  // no .grad before: it is the gradient
      html += `<p class="tt-acc">${e(s.name)}.grad = ${sum}<b class="tt-after">${e(s.after)}</b></p>`;
      return html + note;
    }
    if (s.math) html += `<p class="tt-math">${e(s.math)}</p>`;
    html += `<p>upstream gradient: <b class="tt-up">${e(s.upstream)}</b>${parts}</p>${note}`;
    if (s.saved.length) {
      html += "<p>saved for backward: " + s.saved.map(([w, v]) => `${e(w)} = ${e(v)}`).join("; ") + "</p>";
    }
    html += `<table class="tt-chain"><tr><th>to</th><th>upstream gradient × local derivative = downstream gradient</th></tr>`;
    for (const out of s.sent) {
      const local = out.local ? `<span class="tt-local">${e(out.local)}</span>` : "(the local derivative: see the math)";
      html += `<tr><td>${e(out.input)}</td><td>${e(s.upstream)} × ${local} = ` +
              `<b class="tt-down" data-to="${e(out.to)}">${e(out.gradient)}</b></td></tr>`;
    }
    html += "</table>";
    if (s.sent.some((o) => o.check)) {
      html += `<button class="tt-check-button">check this step</button><div class="tt-checks">`;
      for (const out of s.sent) {
        if (!out.check) continue;
        const c = out.check;
        html += c.estimate === null ? `<p>${e(out.input)}: not checked: ${e(c.why_not)}</p>` :
          `<p>${e(out.input)}: rule <b>${e(c.rule)}</b>, finite differences <b>${e(c.estimate)}</b>: ` +
          `<span class="${c.agrees ? "tt-ok" : "tt-bad"}">${c.agrees ? "agree" : "DIFFER"}</span> ` +
          `<small>(max difference ${e(c.max_difference)})</small></p>`;
      }
      html += "</div>";
    }
    return html;
  }

  function go(i) {
    state.step = Math.max(0, Math.min(steps.length - 1, i));
    update();
  }

  function play() {
    if (state.playing) { clearInterval(state.playing); state.playing = null; }
    else {
      if (state.step >= steps.length - 1) go(0);
      state.playing = setInterval(() => {
        if (state.step >= steps.length - 1) { play(); return; }
        go(state.step + 1);
      }, 900);
    }
    root.querySelector('[data-act="play"]').textContent = state.playing ? "⏸" : "▶";
  }

  const actions = {
    first: () => go(0), prev: () => go(state.step - 1), next: () => go(state.step + 1), last: () => go(steps.length - 1),
    play, values: () => { state.values = !state.values; update(); },
    expand: () => { state.expanded = new Set(modules); render(); },
    collapse: () => { state.expanded = new Set(); render(); },
  };
  for (const button of root.querySelectorAll(".tt-bar button")) {
    button.addEventListener("click", () => actions[button.dataset.act]());
  }
  root.addEventListener("keydown", (event) => {
    const act = {ArrowRight: "next", ArrowLeft: "prev", " ": "play", Home: "first", End: "last"}[event.key];
    if (act) { event.preventDefault(); event.stopPropagation(); actions[act](); }  // not Jupyter's shortcuts
  });
  render();
  return {go, state};
}
