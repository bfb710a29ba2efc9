// Renders the site's formulas with the vendored KaTeX (docs/assets/katex): nothing is fetched at view time.
// Markdown pages: pymdownx.arithmatex (generic mode) wraps each formula in an `.arithmatex` element holding
// \( ... \) or \[ ... \]. Notebook pages (mkdocs-jupyter) keep their markdown cells' $ ... $ as text: those
// cells are rendered with KaTeX's auto-render, which skips code and pre elements.
(function () {
  "use strict";

  function renderArithmatex(root) {
    root.querySelectorAll(".arithmatex").forEach(function (element) {
      var source = element.textContent.trim();
      var display = source.startsWith("\\[");
      var tex = source.replace(/^\\[(\[]/, "").replace(/\\[)\]]$/, "");
      katex.render(tex, element, { displayMode: display, throwOnError: false });
    });
  }

  function renderNotebookCells(root) {
    root.querySelectorAll(".jp-RenderedMarkdown").forEach(function (cell) {
      renderMathInElement(cell, {
        delimiters: [
          { left: "$$", right: "$$", display: true },
          { left: "\\[", right: "\\]", display: true },
          { left: "$", right: "$", display: false },
          { left: "\\(", right: "\\)", display: false },
        ],
        throwOnError: false,
      });
    });
  }

  function render() {
    renderArithmatex(document);
    renderNotebookCells(document);
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(render); // Material's page-load stream (also after instant navigation)
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
