// Drawing and formatting for the live page: the token timeline and the load history, as inline SVG built
// here (no library), plus the number formats every figure on the page uses.

const NS = "http://www.w3.org/2000/svg";

function el(parent, name, attrs, text) {
  const node = document.createElementNS(NS, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  parent.append(node);
  return node;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "…";
  if (s < 1e-3) return `${(s * 1e6).toPrecision(3)} µs`;
  if (s < 1) return `${(s * 1e3).toPrecision(3)} ms`;
  return `${s.toPrecision(3)} s`;
}

export function fmtBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "…";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

export function fmtRate(perS) {
  // Three significant digits, never an exponent: toPrecision(3) wrote a tiny model's 1,234 tok/s as "1.23e+3"
  if (!Number.isFinite(perS)) return "…";
  return `${perS >= 100 ? Math.round(perS) : perS.toPrecision(3)} tok/s`;
}

// An axis step of 1, 2 or 5 x 10^k that gives about `count` ticks over `span`.
function niceStep(span, count) {
  const raw = span / count;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const unit = raw / pow;
  return pow * (unit < 1.5 ? 1 : unit < 3.5 ? 2 : unit < 7.5 ? 5 : 10);
}

function tickLabel(ms, step) {
  const inS = step >= 500;
  const digits = Math.max(0, -Math.floor(Math.log10(inS ? step / 1e3 : step) + 1e-9));
  return `${(inS ? ms / 1e3 : ms).toFixed(digits)} ${inS ? "s" : "ms"}`;
}

// The timeline: token i (1-based, y) against its arrival time since the request was sent (x, ms).
// The shaded band is the wait for the first token (prefill: the whole prompt goes through the model once);
// after it, the dots climb evenly, one per decode step. The cost model's prediction is a dashed line.
//   t = {arrivalsMs: [..], elapsedMs, waiting: bool, pred: {ttftMs, tpotMs} | null}
export function drawTimeline(svg, t) {
  const W = Math.max(Math.round(svg.getBoundingClientRect().width) || 600, 260);
  const H = 210;
  const m = { l: 36, r: 14, t: 30, b: 30 };
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const times = t.arrivalsMs;
  const n = times.length;
  const predEnd = t.pred ? t.pred.ttftMs + Math.max(n - 1, 0) * t.pred.tpotMs : 0;
  const end = Math.max(t.elapsedMs, n ? times[n - 1] : 0, predEnd, 1) * 1.04;
  const top = Math.max(n, 1);
  const x = (ms) => m.l + (W - m.l - m.r) * ms / end;
  const y = (i) => H - m.b - (H - m.t - m.b) * i / top;

  const axes = el(svg, "g", { class: "axes" });
  el(axes, "line", { x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b });
  el(axes, "line", { x1: m.l, y1: m.t, x2: m.l, y2: H - m.b });
  const step = niceStep(end, Math.max(2, Math.floor((W - m.l - m.r) / 80)));
  for (let k = 0; k * step <= end; k += 1) {
    const ms = k * step;
    el(axes, "line", { x1: x(ms), y1: H - m.b, x2: x(ms), y2: H - m.b + 4 });
    el(axes, "text", { x: x(ms), y: H - m.b + 15, "text-anchor": "middle" }, tickLabel(ms, step));
  }
  el(axes, "text", { x: W - m.r, y: H - 3, "text-anchor": "end" }, "time since sent");
  el(axes, "text", { x: m.l - 5, y: y(top) + 4, "text-anchor": "end" }, String(top));
  el(axes, "text", { x: m.l - 5, y: H - m.b + 4, "text-anchor": "end" }, "0");
  el(axes, "text", { x: m.l + 4, y: m.t - 18 }, "tokens");

  const gapMs = n ? times[0] : (t.waiting ? t.elapsedMs : 0);
  if (gapMs > 0) {
    const x0 = x(0), x1 = x(gapMs);
    el(svg, "rect", { class: "prefill", x: x0, y: m.t, width: Math.max(x1 - x0, 1), height: H - m.t - m.b });
    el(svg, "line", { class: "bracket", x1: x0, y1: m.t - 6, x2: x1, y2: m.t - 6 });
    el(svg, "line", { class: "bracket", x1: x1, y1: m.t - 10, x2: x1, y2: H - m.b });
    const label = n ? `TTFT ${fmtSeconds(gapMs / 1e3)}` : `waiting for the first token… ${fmtSeconds(gapMs / 1e3)}`;
    const right = x1 - x0 < 110;  // a narrow gap: write the label beside it
    el(svg, "text", { class: "ttft-label", x: right ? x1 + 5 : (x0 + x1) / 2, y: m.t - 10,
                      "text-anchor": right ? "start" : "middle" }, label);
  }
  if (t.pred && n) {
    el(svg, "line", { class: "pred", x1: x(t.pred.ttftMs), y1: y(1), x2: x(predEnd), y2: y(n) });
  }
  const marks = el(svg, "g", { class: "marks" });
  times.forEach((ms, i) => {
    el(marks, "line", { class: "rug", x1: x(ms), y1: H - m.b, x2: x(ms), y2: H - m.b - 5 });
    el(marks, "circle", { class: "tok", cx: x(ms), cy: y(i + 1), r: 2.6 });
  });
  if (n > 1) {
    const tpotMs = (times[n - 1] - times[0]) / (n - 1);
    el(svg, "text", { class: "decode-label", x: Math.min(x(times[n - 1]), W - m.r), y: Math.max(y(n) - 6, m.t + 10),
                      "text-anchor": "end" }, `decode: a token every ${fmtSeconds(tpotMs / 1e3)}`);
  }
  svg.setAttribute("aria-label", n
    ? `${n} tokens; the first after ${fmtSeconds(times[0] / 1e3)}` +
      (n > 1 ? `, then one every ${fmtSeconds((times[n - 1] - times[0]) / (n - 1) / 1e3)} on average` : "")
    : (t.waiting ? "waiting for the first token" : "no request yet"));
}

// The load history: running and queued sequences (lines) and the KV pool's use (shaded), last samples.
//   samples = [{running, queued, maxBatch, kvFrac | null}]
export function drawHistory(svg, samples, capacity) {
  const W = Math.max(Math.round(svg.getBoundingClientRect().width) || 300, 200);
  const H = 70;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  if (!samples.length) return;
  const x = (i) => W * i / Math.max(capacity - 1, 1);
  const peak = Math.max(1, ...samples.map((s) => s.running + s.queued));
  const y = (v) => H - 2 - (H - 14) * v / peak;
  const offset = capacity - samples.length;
  if (samples[0].kvFrac !== null) {
    const pts = samples.map((s, i) => `${x(offset + i)},${H - 2 - (H - 14) * s.kvFrac}`);
    el(svg, "polygon", { class: "kv", points: `${x(offset)},${H - 2} ${pts.join(" ")} ${x(capacity - 1)},${H - 2}` });
  }
  for (const [key, cls] of [["queued", "queued"], ["running", "running"]]) {
    el(svg, "polyline", { class: cls, points: samples.map((s, i) => `${x(offset + i)},${y(s[key])}`).join(" ") });
  }
  el(svg, "text", { x: 3, y: 10 }, `peak ${peak}`);
}
