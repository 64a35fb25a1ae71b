// Drawing helpers of the explainer: a heatmap on a canvas (viridis, colour-blind safe, the causal mask hatched),
// line charts in SVG, and the tables that stand beside every picture as its text alternative.

const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58",
                 "#b5de2b", "#fde725"];

function hex(c) { return [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)); }
const STOPS = VIRIDIS.map(hex);

export function colour(v) {  // v in [0, 1] -> an rgb() string along viridis
  const x = Math.min(Math.max(v, 0), 1) * (STOPS.length - 1), i = Math.min(Math.floor(x), STOPS.length - 2);
  const f = x - i, a = STOPS[i], b = STOPS[i + 1];
  return `rgb(${a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",")})`;
}

// rows: a list of rows (each a list of weights, any length up to n); n: columns. Cells past a row's end, or
// masked (mask(i, j) true), are drawn hatched: the causal mask made visible. focus: {row, col} to outline.
// perRow: each row coloured from 0 to its own largest weight (a long row's weights are small: on one scale for
// the whole grid, the first rows' would hide the rest).
export function heatmap(canvas, rows, n, {mask = null, focus = null, max = null, perRow = false} = {}) {
  const css = Math.min(canvas.parentElement.clientWidth || 480, 640);
  const cell = Math.max(2, Math.floor(css / Math.max(n, 1)));
  const size = cell * n, ratio = window.devicePixelRatio || 1;
  canvas.style.width = size + "px";
  canvas.style.height = cell * rows.length + "px";
  canvas.width = size * ratio;
  canvas.height = cell * rows.length * ratio;
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  const top = max || Math.max(1e-9, ...rows.flat());
  for (let i = 0; i < rows.length; i++) {
    for (let j = 0; j < n; j++) {
      const hidden = j >= rows[i].length || (mask && mask(i, j));
      if (hidden) {
        g.fillStyle = "#d0d0d0";
        g.fillRect(j * cell, i * cell, cell, cell);
        if (cell >= 6) {
          g.strokeStyle = "#9a9a9a";
          g.beginPath();
          g.moveTo(j * cell, (i + 1) * cell);
          g.lineTo((j + 1) * cell, i * cell);
          g.stroke();
        }
      } else {
        const scale = perRow ? Math.max(1e-9, ...rows[i].filter((_, k) => !(mask && mask(i, k)))) : top;
        g.fillStyle = colour(rows[i][j] / scale);
        g.fillRect(j * cell, i * cell, cell, cell);
      }
    }
  }
  if (focus) {
    g.lineWidth = 2;
    g.strokeStyle = "#ff4d4d";
    if (focus.row != null) g.strokeRect(0, focus.row * cell, size, cell);
    if (focus.col != null) g.strokeRect(focus.col * cell, 0, cell, cell * rows.length);
  }
  canvas.dataset.cell = cell;
  return cell;
}

// The cell under a pointer event, or null.
export function cellAt(canvas, ev) {
  const r = canvas.getBoundingClientRect(), cell = Number(canvas.dataset.cell || 1);
  const i = Math.floor((ev.clientY - r.top) / cell), j = Math.floor((ev.clientX - r.left) / cell);
  return i >= 0 && j >= 0 ? {i, j} : null;
}

const SVG = "http://www.w3.org/2000/svg";
const DASH = ["", "6 4", "2 3", "8 3 2 3"];
const LINE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7"];  // Okabe-Ito: safe for colour-blind readers

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

// series: [{name, xs, ys}]; each line has its own colour and dash, and a legend entry.
export function lineChart(svg, series, {xlabel = "", ylabel = "", logX = false, logY = false} = {}) {
  svg.replaceChildren();
  const W = 560, H = 280, L = 64, R = 12, T = 12, B = 44;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const pts = series.flatMap(s => s.xs.map((x, i) => [x, s.ys[i]])).filter(([x, y]) => y != null && isFinite(y));
  if (!pts.length) return;
  const fx = logX ? Math.log10 : v => v, fy = logY ? Math.log10 : v => v;
  const xs = pts.map(p => fx(p[0])), ys = pts.map(p => fy(Math.max(p[1], logY ? 1e-12 : -Infinity)));
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) y1 = y0 + 1;
  if (!logY) y0 = Math.min(0, y0);
  const px = x => L + (fx(x) - x0) / (x1 - x0) * (W - L - R);
  const py = y => H - B - (fy(logY ? Math.max(y, 1e-12) : y) - y0) / (y1 - y0) * (H - T - B);
  el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"}, svg);
  el("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"}, svg);
  const fmt = v => Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(1) : +v.toPrecision(3);
  for (let k = 0; k <= 4; k++) {
    const yv = y0 + (y1 - y0) * k / 4, xv = x0 + (x1 - x0) * k / 4;
    el("text", {x: L - 6, y: py(logY ? 10 ** yv : yv) + 4, "text-anchor": "end", class: "tick"}, svg).textContent =
      fmt(logY ? 10 ** yv : yv);
    el("text", {x: px(logX ? 10 ** xv : xv), y: H - B + 16, "text-anchor": "middle", class: "tick"}, svg).textContent =
      fmt(logX ? 10 ** xv : xv);
  }
  el("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "label"}, svg).textContent = xlabel;
  el("text", {x: 12, y: (T + H - B) / 2, transform: `rotate(-90 12 ${(T + H - B) / 2})`, "text-anchor": "middle",
              class: "label"}, svg).textContent = ylabel;
  series.forEach((s, n) => {
    const d = s.xs.map((x, i) => s.ys[i] == null ? null : `${px(x)},${py(s.ys[i])}`).filter(Boolean);
    el("polyline", {points: d.join(" "), fill: "none", stroke: LINE[n % 4], "stroke-width": 2,
                    "stroke-dasharray": DASH[n % 4]}, svg);
    s.xs.forEach((x, i) => s.ys[i] != null && el("circle", {cx: px(x), cy: py(s.ys[i]), r: 3, fill: LINE[n % 4]}, svg));
    const lx = L + 10, ly = T + 6 + n * 20;  // the legend stacked, so long names never overlap at any width
    el("line", {x1: lx, y1: ly, x2: lx + 24, y2: ly, stroke: LINE[n % 4], "stroke-width": 2,
                "stroke-dasharray": DASH[n % 4]}, svg);
    el("text", {x: lx + 28, y: ly + 4, class: "tick"}, svg).textContent = s.name;
  });
}

// A table: header cells, then rows of cell values (numbers are shown to 4 significant digits).
export function table(tableEl, header, rows) {
  const cell = (tag, v) => {
    const c = document.createElement(tag);
    c.textContent = typeof v === "number" ? String(+v.toPrecision(4)) : (v ?? "–");
    return c;
  };
  const head = document.createElement("thead"), tr = document.createElement("tr");
  header.forEach(h => tr.appendChild(cell("th", h)));
  head.appendChild(tr);
  const body = document.createElement("tbody");
  rows.forEach(r => {
    const row = document.createElement("tr");
    r.forEach(v => row.appendChild(cell("td", v)));
    body.appendChild(row);
  });
  tableEl.replaceChildren(head, body);
}
