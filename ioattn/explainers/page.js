"use strict";
// The explainer pages' shared script: number formatting, element builders, SVG heatmaps and bars,
// and the step controls. A page's own script reads its numbers from DATA only.

const DATA = JSON.parse(document.getElementById("data").textContent);
const SVG_NS = "http://www.w3.org/2000/svg";  // a namespace name, never fetched

// A number as text: `digits` significant digits, exponent form for the very small and large;
// null (the data's -inf) as "-∞".
function fmt(x, digits = 4) {
  if (x === null) return "-∞";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a < 1e-3 || a >= 1e5) return x.toExponential(digits - 1);
  return x.toPrecision(digits);
}

// Bytes in binary units (KiB, MiB, GiB).
function fmtBytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return `${b.toPrecision(3)} ${units[i]}`;
}

function byId(id) { return document.getElementById(id); }
function setText(id, text) { byId(id).textContent = text; }

// An element: make(tag, {attr: value}, child, ...); children are nodes or text.
function build(ns, tag, attrs, children) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}
function make(tag, attrs, ...children) { return build(null, tag, attrs, children); }
function svg(tag, attrs, ...children) { return build(SVG_NS, tag, attrs, children); }

// Colours: diverging (blue below 0, red above) and sequential (white to blue), t scaled to [-1, 1] / [0, 1].
function diverging(t) {
  t = Math.max(-1, Math.min(1, t));
  const [r, g, b] = t >= 0 ? [212, 83, 43] : [47, 111, 219];
  const a = Math.abs(t);
  return `rgb(${Math.round(255 + (r - 255) * a)},${Math.round(255 + (g - 255) * a)},${Math.round(255 + (b - 255) * a)})`;
}
function sequential(t) { return diverging(-Math.max(0, Math.min(1, t))); }

// A heatmap of a matrix (rows of numbers, null for -inf, undefined for an empty cell): one cell per
// entry with its value printed.
// opts: cell (width, px), cellH (height; default the width), digits, color(value) -> css colour,
// shade(i, j) -> opacity, id (prefix of the labels' ids), rowNames, colNames, frame [c0, c1] (columns to outline).
function heatmap(values, opts = {}) {
  const cw = opts.cell || 44, ch = opts.cellH || cw, digits = opts.digits || 2;
  const left = opts.rowNames ? 34 : 0, top = opts.colNames ? 18 : 0;
  const rows = values.length, cols = values[0].length;
  const root = svg("svg", {width: left + cols * cw + 4, height: top + rows * ch + 4});
  values.forEach((row, i) => row.forEach((x, j) => {
    const g = svg("g", {opacity: opts.shade ? opts.shade(i, j) : 1});
    g.append(svg("rect", {x: left + j * cw, y: top + i * ch, width: cw - 2, height: ch - 2, rx: 3,
                          fill: x === null || x === undefined ? "#eee" : (opts.color ? opts.color(x) : "#eee")}));
    root.append(g);
    if (x === undefined) return;  // an entry not computed yet: an empty cell
    const label = svg("text", {x: left + j * cw + cw / 2 - 1, y: top + i * ch + ch / 2 + 3, "text-anchor": "middle"},
                      fmt(x, digits));
    if (opts.id) label.setAttribute("id", `${opts.id}-${i}-${j}`);
    g.append(label);
  }));
  (opts.rowNames || []).forEach((n, i) => root.append(svg("text", {x: 2, y: top + i * ch + ch / 2 + 3}, n)));
  (opts.colNames || []).forEach((n, j) => root.append(svg("text", {x: left + j * cw + cw / 2 - 1, y: 12, "text-anchor": "middle"}, n)));
  if (opts.frame) {
    const [c0, c1] = opts.frame;
    root.append(svg("rect", {class: "frame", x: left + c0 * cw - 2, y: top - 2, width: (c1 - c0) * cw + 2, height: rows * ch + 2, rx: 4}));
  }
  return root;
}

// Horizontal or vertical bars. items: [{label, value, color}]; opts: width, height, max, log (log10 axis
// from opts.min), digits, vertical, line (a value drawn as a dashed line, with opts.lineLabel).
function bars(items, opts = {}) {
  const w = opts.width || 420, h = opts.height || 24 * items.length + 10;
  const root = svg("svg", {width: w, height: h});
  const max = opts.max || Math.max(...items.map(d => d.value));
  const scale = v => opts.log ? Math.max(0, Math.log10(v / opts.min) / Math.log10(max / opts.min)) : v / max;
  if (opts.vertical) {
    const bw = (w - 10) / items.length, base = h - 16, room = base - 18;  // room above for the line's label
    items.forEach((d, i) => {
      const bh = Math.max(1, scale(d.value) * room);
      root.append(svg("rect", {x: 5 + i * bw, y: base - bh, width: Math.max(1, bw - 2), height: bh, fill: d.color || "#2f6fdb"}));
      if (d.label) root.append(svg("text", {x: 5 + i * bw + bw / 2, y: h - 3, "text-anchor": "middle"}, d.label));
    });
    if (opts.line !== undefined) {
      const y = base - scale(opts.line) * room;
      root.append(svg("line", {x1: 0, x2: w, y1: y, y2: y, stroke: "#d4532b", "stroke-dasharray": "5 4"}));
      root.append(svg("text", {x: w - 4, y: y - 4, "text-anchor": "end", fill: "#d4532b"}, opts.lineLabel || ""));
    }
    return root;
  }
  const labelW = opts.labelWidth || 110, valueW = 80;
  items.forEach((d, i) => {
    const y = 5 + i * 24;
    root.append(svg("text", {x: 0, y: y + 14}, d.label));
    root.append(svg("rect", {x: labelW, y, width: Math.max(1, scale(d.value) * (w - labelW - valueW)), height: 18, rx: 3,
                             fill: d.color || "#2f6fdb"}));
    root.append(svg("text", {x: labelW + scale(d.value) * (w - labelW - valueW) + 5, y: y + 14}, d.text || fmt(d.value, opts.digits || 3)));
  });
  return root;
}

// Put `node` into the element with id `id`, replacing what was there.
function show(id, node) { byId(id).replaceChildren(node); }

// Step controls: buttons #<prefix>prev / #<prefix>next and a range input #<prefix>step over 0..n-1.
// Calls onStep(i) now and after every change; returns {set(i), n(count)} to move or resize it.
function stepper(prefix, count, onStep) {
  const prev = byId(prefix + "prev"), next = byId(prefix + "next"), slider = byId(prefix + "step");
  let n = count, i = 0;
  function set(k) {
    i = Math.max(0, Math.min(n - 1, k));
    slider.max = String(n - 1);
    slider.value = String(i);
    prev.disabled = i === 0;
    next.disabled = i === n - 1;
    onStep(i);
  }
  prev.addEventListener("click", () => set(i - 1));
  next.addEventListener("click", () => set(i + 1));
  slider.addEventListener("input", () => set(Number(slider.value)));
  set(0);
  return {set, resize(m, k) { n = m; set(k === undefined ? i : k); }};
}

// The footer: where the numbers come from.
function sourceLine() {
  const foot = byId("source");
  if (foot) foot.textContent = "Numbers: " + DATA.source + ".";
}
document.addEventListener("DOMContentLoaded", sourceLine);
