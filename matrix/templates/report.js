// policy-matrix report: filters and sortable tables. Vanilla, no network; the page's
// Content-Security-Policy admits exactly this script by its sha256.
"use strict";
(() => {
  const controls = document.getElementById("filters");
  const hideSkip = document.getElementById("hide-skip");
  const counter = document.getElementById("filter-count");
  controls.hidden = false;  // without this script the controls would do nothing, so they stay hidden

  // Every element that stands for a cell carries data-verdict (and data-fallback="1" when a node
  // left the requested device); placement rows carry data-node-fallback.
  function hidden(element, show) {
    const verdict = element.dataset.verdict;
    if (hideSkip.checked && verdict === "SKIP") return true;
    if (show === "fail") return verdict !== "FAIL";
    if (show === "fallback") return element.dataset.fallback !== "1";
    return false;
  }

  function applyFilters() {
    const show = controls.querySelector("input[name=show]:checked").value;
    let shown = 0, total = 0;
    for (const element of document.querySelectorAll("[data-verdict]")) {
      const out = hidden(element, show);
      element.classList.toggle("filtered", out);
      if (element.matches("td.cell")) { total += 1; shown += out ? 0 : 1; }
    }
    for (const row of document.querySelectorAll("table.grid tbody tr")) {  // a target with nothing left to show
      row.classList.toggle("filtered", !row.querySelector("td.cell[data-verdict]:not(.filtered)"));
    }
    for (const row of document.querySelectorAll("tr[data-node-fallback]")) {
      row.classList.toggle("filtered", show === "fallback" && row.dataset.nodeFallback !== "1");
    }
    counter.textContent = shown === total ? `all ${total} cells` : `${shown} of ${total} cells shown`;
  }

  controls.addEventListener("change", applyFilters);
  applyFilters();

  // Sortable tables: click a header; numbers sort as numbers (data-sort when the text is formatted).
  function sortKey(row, column) {
    const cell = row.children[column];
    const raw = cell ? (cell.dataset.sort ?? cell.textContent.trim()) : "";
    const number = Number.parseFloat(raw);
    return Number.isNaN(number) ? raw.toLowerCase() : number;
  }

  function sortBy(table, header) {
    const column = Array.from(header.parentElement.children).indexOf(header);
    const ascending = header.getAttribute("aria-sort") !== "ascending";
    for (const other of header.parentElement.children) other.removeAttribute("aria-sort");
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = sortKey(a, column), y = sortKey(b, column);
      if (x === y) return 0;
      if (x === "" || y === "") return x === "" ? 1 : -1;  // empty cells last either way
      if (typeof x !== typeof y) return typeof x === "number" ? -1 : 1;
      return (x < y ? -1 : 1) * (ascending ? 1 : -1);
    });
    body.append(...rows);
  }

  // Chart labels: the server fits each by an estimate of letter widths, which a run of wide letters (W, M)
  // beats; here the real font measures it. One that still runs past the chart's left edge keeps its start and
  // end around an ellipsis, as the server cuts them, and shows the whole label on hover.
  function fitLabel(label) {
    const room = label.x.baseVal[0].value;
    if (label.getComputedTextLength() <= room) return;
    const link = label.parentElement;
    let title = link.querySelector("title");
    if (!title) {
      title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = label.textContent;
      link.prepend(title);
    }
    const letters = Array.from(title.textContent);
    const cut = (kept) => {
      const head = Math.ceil(kept / 3);
      return letters.slice(0, head).join("") + "…" + letters.slice(letters.length - (kept - head)).join("");
    };
    let low = 0, high = letters.length - 1;  // the most letters kept that fit
    while (low < high) {
      const kept = Math.ceil((low + high) / 2);
      label.textContent = cut(kept);
      if (label.getComputedTextLength() <= room) low = kept; else high = kept - 1;
    }
    label.textContent = cut(low);
  }

  for (const label of document.querySelectorAll("svg.dotplot text.label")) fitLabel(label);

  for (const table of document.querySelectorAll("table.sortable")) {
    for (const header of table.tHead.rows[0].cells) {
      header.tabIndex = 0;
      header.title = "sort";
      header.addEventListener("click", () => sortBy(table, header));
      header.addEventListener("keydown", (event) => { if (event.key === "Enter") sortBy(table, header); });
    }
  }
})();
