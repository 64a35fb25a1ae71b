// The explainer's page: one prompt, six views, each a picture with a table beside it and a number measured now.
// What each view last received is kept on window.explain (the tests read the page's data back from there).
import {cellAt, heatmap, lineChart, table} from "./charts.js";

const $ = sel => document.querySelector(sel);
const state = window.explain = {facts: null, attention: null, decode: null, order: null, grid: null, budget: null,
                                recurrence: null, focus: null};
const ms = s => s == null ? null : s * 1e3;
const show = t => t.replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";

// Under `attnlab serve` with an API key, the key the server's own page keeps (same origin, same storage).
function auth() {
  const key = localStorage.getItem("attnlab.apiKey");
  return key ? {Authorization: `Bearer ${key}`} : {};
}

async function call(path, body) {
  const r = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json", ...auth()},
                               body: JSON.stringify(body)});
  if (!r.ok) {
    let msg = `${r.status}`;
    try { msg = (await r.json()).error.message; } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }
  return r;
}

async function busy(label, fn) {
  $("#error").textContent = "";
  $("#status").textContent = label + "…";
  document.querySelectorAll("button").forEach(b => { if (!b.closest(".tabs") && !b.closest(".tokens")) b.disabled = true; });
  try {
    await fn();
    $("#status").textContent = "";
  } catch (e) {
    $("#status").textContent = "";
    $("#error").textContent = e.message;
  } finally {
    document.querySelectorAll("button").forEach(b => { b.disabled = false; });
  }
}

const prompt = () => $("#prompt").value;

// --- tabs: arrow keys move between them, Enter or a click opens one
const tabs = [...document.querySelectorAll("[role=tab]")];
function openTab(tab) {
  tabs.forEach(t => {
    const on = t === tab;
    t.setAttribute("aria-selected", on);
    t.tabIndex = on ? 0 : -1;
    document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
  });
  tab.focus();
}
tabs.forEach((t, i) => {
  t.addEventListener("click", () => openTab(t));
  t.addEventListener("keydown", e => {
    const step = {ArrowRight: 1, ArrowLeft: -1}[e.key];
    if (step) { e.preventDefault(); openTab(tabs[(i + step + tabs.length) % tabs.length]); }
  });
});

// --- attention
function fillSelect(sel, n, value) {
  sel.replaceChildren(...Array.from({length: n}, (_, i) => new Option(String(i), i, false, i === value)));
}

function drawAttention() {
  const a = state.attention;
  if (!a) return;
  const f = state.focus;
  heatmap($("#heatmap"), a.weights, a.tokens.length, {mask: (i, j) => !a.visible[i][j],
                                                      focus: f == null ? null : {row: f, col: f},
                                                      perRow: $("#scale").value === "row"});
  $("#heatmap").setAttribute("aria-label", `attention weights of layer ${a.layer}, head ${a.head}: ${a.tokens.length} ` +
    `by ${a.tokens.length}, the table below holds every value`);
  document.querySelectorAll("#tokens button").forEach((b, i) => b.classList.toggle("on", i === f));
  if (f != null) {  // the largest visible weight of the focused row, and of its column
    const argmax = (vals, ok) => vals.reduce((best, v, k) => ok(k) && (best < 0 || v > vals[best]) ? k : best, -1);
    const row = a.weights[f], col = a.weights.map(r => r[f]);
    const best = argmax(row, j => a.visible[f][j]), reader = argmax(col, i => a.visible[i][f]);
    $("#focus-text").textContent = `“${show(a.tokens[f])}” (token ${f}) attends most to “${show(a.tokens[best])}” ` +
      `(${(row[best] * 100).toFixed(1)}%); the token that attends most to it is “${show(a.tokens[reader])}” ` +
      `(${(col[reader] * 100).toFixed(1)}%).`;
  }
}

function renderAttention(a) {
  state.attention = a;
  state.focus = null;
  fillSelect($("#layer"), a.layers, a.layer);
  fillSelect($("#head"), a.heads, a.head);
  const box = $("#tokens");
  box.replaceChildren(...a.tokens.map((t, i) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = show(t);
    b.setAttribute("aria-label", `token ${i}: ${show(t)}`);
    const on = () => { state.focus = i; drawAttention(); };
    b.addEventListener("focus", on);
    b.addEventListener("mouseenter", on);
    return b;
  }));
  $("#prefill-time").textContent = `prefill of ${a.tokens.length} tokens: ${ms(a.prefill.median_s).toFixed(2)} ms ` +
    `(median of ${a.prefill.repeats}, kernel ${a.kernel})`;
  $("#focus-text").textContent = "";
  drawAttention();
  table($("#attention-table"), ["query \\ key", ...a.tokens.map(show)],
        a.weights.map((r, i) => [show(a.tokens[i]), ...a.tokens.map((_, j) => a.visible[i][j] ? r[j] : "")]));
  const L = a.layer;
  table($("#heads-table"), ["head", "mean entropy (bits)", "last row's entropy", "mean largest weight"],
        a.entropy_bits[L].map((e, h) => [h, e.reduce((x, y) => x + y, 0) / e.length, e[e.length - 1],
                                         a.max_weight[L][h].reduce((x, y) => x + y, 0) / e.length]));
}

async function loadAttention() {
  const r = await call("api/attention", {prompt: prompt(), layer: Number($("#layer").value || 0),
                                         head: Number($("#head").value || 0)});
  renderAttention(await r.json());
}

$("#heatmap").addEventListener("mousemove", e => {
  const c = cellAt($("#heatmap"), e);
  if (c && state.attention && c.i < state.attention.tokens.length && state.focus !== c.i) {
    state.focus = c.i;
    drawAttention();
  }
});
$("#scale").addEventListener("change", drawAttention);
for (const id of ["#layer", "#head"]) $(id).addEventListener("change", () => busy("Reading the weights", loadAttention));

// --- budget
async function loadBudget() {
  const b = await (await call("api/budget", {prompt: prompt(), filler: $("#filler").value})).json();
  state.budget = b;
  const L = b.rows.entropy_bits.length, rows = b.tokens.map((_, i) => i);
  lineChart($("#rows-chart"), [
    ...Array.from({length: Math.min(L, 3)}, (_, l) => ({name: `layer ${l}`, xs: rows, ys: b.rows.entropy_bits[l]})),
    {name: "evenly spread (log2 (i + 1))", xs: rows, ys: b.rows.uniform_bits}],
    {xlabel: "row i (token position)", ylabel: "entropy of row i (bits)"});
  table($("#rows-table"), ["row", "token", ...Array.from({length: L}, (_, l) => `layer ${l}: entropy / largest`)],
        rows.map(i => [i, show(b.tokens[i]), ...b.rows.entropy_bits.map((e, l) =>
          `${+e[i].toPrecision(3)} / ${+b.rows.max_weight[l][i].toPrecision(3)}`)]));
  lineChart($("#budget-chart"), [
    ...Array.from({length: Math.min(L, 3)}, (_, l) => ({name: `layer ${l}`, xs: b.by_prefix.map(p => p.tokens),
                                                        ys: b.by_prefix.map(p => p.entropy_bits[l])})),
    {name: "evenly spread (log2 n)", xs: b.by_prefix.map(p => p.tokens), ys: b.by_prefix.map(p => p.uniform_bits)}],
    {xlabel: "tokens in the prompt", ylabel: "entropy of the last row (bits)", logX: true});
  table($("#budget-table"), ["tokens", ...Array.from({length: L}, (_, l) => `layer ${l}: entropy / largest`)],
        b.by_prefix.map(p => [p.tokens, ...p.entropy_bits.map((e, l) => `${+e.toPrecision(3)} / ${+p.max_weight[l].toPrecision(3)}`)]));
  lineChart($("#filler-chart"), Array.from({length: Math.min(L, 3)}, (_, l) => (
    {name: `layer ${l}`, xs: b.by_filler.map(p => p.inserted_tokens), ys: b.by_filler.map(p => p.weight_on_prompt[l])})),
    {xlabel: "irrelevant tokens inserted", ylabel: "last row's weight on the prompt"});
  table($("#filler-table"), ["inserted tokens", ...Array.from({length: L}, (_, l) =>
          `layer ${l}: weight on the prompt / entropy / largest`)],
        b.by_filler.map(p => [p.inserted_tokens, ...p.weight_on_prompt.map((w, l) =>
          `${+w.toPrecision(3)} / ${+p.entropy_bits[l].toPrecision(3)} / ${+p.max_weight[l].toPrecision(3)}`)]));
}
$("#budget-run").addEventListener("click", () => busy("Measuring the budget", loadBudget));

// --- prefill vs decode
async function loadDecode() {
  const r = await call("api/decode", {prompt: prompt(), new_tokens: Number($("#new-tokens").value)});
  const d = state.decode = {prefill: null, rows: [], steps: [], drawn: []};  // drawn: the grid's rows at each event
  const layer = Number($("#layer").value || 0), head = Number($("#head").value || 0);
  const reader = r.body.getReader(), text = new TextDecoder();
  let buf = "";
  const draw = () => {
    const grid = d.prefill.weights[layer][head].concat(d.rows.map(row => row[layer][head]));
    d.drawn.push(grid.length);
    heatmap($("#decode-grid"), grid, grid.length, {mask: (i, j) => j > i, perRow: true});
    table($("#decode-weights"), ["row \\ key", ...grid.map((_, j) => j)],
          grid.map((r, i) => [i < d.prefill.tokens.length ? `prefill ${i}` : `step ${i - d.prefill.tokens.length + 1}`,
                              ...grid.map((_, j) => j < r.length ? r[j] : "")]));
    const last = d.steps.length ? d.steps[d.steps.length - 1] : d.prefill;
    const partial = last.kv_tokens - (last.kv_blocks - 1) * d.prefill.block_size;
    $("#kv-text").textContent = `KV cache: ${last.kv_tokens} tokens in ${last.kv_blocks} blocks of ` +
      `${d.prefill.block_size} (the last holds ${partial}); a new block is taken when one fills.`;
    $("#kv-blocks").replaceChildren(...Array.from({length: last.kv_blocks}, (_, i) => {
      const s = document.createElement("span");
      const filled = last.kv_tokens - i * d.prefill.block_size;
      s.className = filled >= d.prefill.block_size ? "full" : "part";
      s.title = `block ${i}: ${Math.min(filled, d.prefill.block_size)} of ${d.prefill.block_size} tokens`;
      return s;
    }));
    table($("#decode-table"), ["step", "token", "ms (engine)", "rows computed", "KV tokens", "KV blocks"],
          [["prefill", `${d.prefill.tokens.length} prompt tokens`, ms(d.prefill.seconds), d.prefill.tokens.length,
            d.prefill.kv_tokens, d.prefill.kv_blocks],
           ...d.steps.map(s => [s.step, show(s.token), ms(s.seconds), 1, s.kv_tokens, s.kv_blocks])]);
    const step = d.steps.filter(s => s.seconds != null).map(s => s.seconds);
    $("#decode-summary").textContent = step.length ? `prefill ${ms(d.prefill.seconds).toFixed(2)} ms for ` +
      `${d.prefill.tokens.length} rows; decode ${ms(step.reduce((x, y) => x + y, 0) / step.length).toFixed(2)} ms a row` : "";
  };
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += text.decode(value, {stream: true});
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const ev = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      if (ev.phase === "error") throw new Error(ev.message);
      if (ev.phase === "prefill") d.prefill = ev;
      else { d.rows.push(ev.row); d.steps.push(ev); }
      draw();
    }
  }
}
$("#decode-run").addEventListener("click", () => busy("Generating", loadDecode));

// --- the n^2 grid
async function loadGrid() {
  const g = state.grid = await (await call("api/grid", {max_tokens: Math.min(state.facts.max_seq_len, 512)})).json();
  const xs = g.rows.map(r => r.tokens);
  lineChart($("#grid-chart"), [{name: "measured", xs, ys: g.rows.map(r => ms(r.prefill.median_s))},
                               {name: "cost model", xs, ys: g.rows.map(r => ms(r.predicted_s))}],
            {xlabel: "prompt tokens n", ylabel: "prefill ms", logX: true, logY: true});
  table($("#grid-table"), ["n", "score cells (all layers, heads)", "measured ms", "predicted ms", "cells per ms"],
        g.rows.map(r => [r.tokens, r.score_cells, ms(r.prefill.median_s), ms(r.predicted_s),
                         r.score_cells / ms(r.prefill.median_s)]));
  $("#grid-note").textContent = g.rows.some(r => r.predicted_s == null) ?
    "the cost model's prediction appears once this machine is measured (started with the server; about a minute)" : "";
}
$("#grid-run").addEventListener("click", () => busy("Timing prefills", loadGrid));

// --- order
async function loadOrder() {
  const o = state.order = await (await call("api/order", {prompt: prompt(), seed: Number($("#seed").value || 0),
                                                          head: Number($("#head").value || 0)})).json();
  const n = o.tokens.length;
  heatmap($("#order-plain"), o.without_positions.original, n);
  heatmap($("#order-plain-shuffled"), o.without_positions.shuffled, n);
  heatmap($("#order-pos"), o.with_positions.original, n);
  heatmap($("#order-pos-shuffled"), o.with_positions.shuffled, n);
  const box = $("#order-tables");
  box.replaceChildren();
  for (const [title, m, toks] of [
      ["Without positions: original", o.without_positions.original, o.tokens],
      ["Without positions: shuffled", o.without_positions.shuffled, o.perm.map(p => o.tokens[p])],
      ["With positions: original", o.with_positions.original, o.tokens],
      ["With positions: shuffled", o.with_positions.shuffled, o.perm.map(p => o.tokens[p])]]) {
    const h = document.createElement("h4"), t = document.createElement("table");
    h.textContent = title;
    table(t, ["query \\ key", ...toks.map(show)], m.map((r, i) => [show(toks[i]), ...r]));
    box.append(h, t);
  }
  $("#order-figures").textContent = `largest difference from the permuted original: without positions ` +
    `${o.without_positions.max_abs_difference.toExponential(1)}, with positions ` +
    `${o.with_positions.max_abs_difference.toExponential(1)} (order: ${o.perm.join(", ")})`;
  $("#rope-box").hidden = !o.rope;
  if (o.rope) {
    // two charts: the rotation's own score (0 to 1) and the model's logits have unrelated scales
    lineChart($("#rope-chart"), [{name: "Σ cos(dθ) / its value at 0", xs: o.rope.distance,
                                  ys: o.rope.cos_sum.map(v => v / o.rope.cos_sum[0])}],
              {xlabel: "relative distance d (tokens)", ylabel: "the rotation's score"});
    lineChart($("#rope-measured"), [{name: "this model's mean first-layer logit", xs: o.rope.distance,
                                     ys: o.rope.mean_logit}],
              {xlabel: "relative distance d (tokens)", ylabel: "mean logit"});
    table($("#rope-table"), ["distance", "mean first-layer logit", "Σ cos(dθ) / its value at 0"],
          o.rope.distance.map((d, i) => [d, o.rope.mean_logit[i], o.rope.cos_sum[i] / o.rope.cos_sum[0]]));
  }
}
$("#order-run").addEventListener("click", () => busy("Shuffling", loadOrder));

// --- recurrence
async function loadRecurrence() {
  const r = state.recurrence = await (await call("api/recurrence", {prompt: prompt()})).json();
  const xs = r.tokens.map((_, i) => i);
  lineChart($("#rec-chart"), [{name: "state norm", xs, ys: r.state_norm}, {name: "step change", xs, ys: r.step_change},
                              ...(r.influence ? [{name: "influence on the last prediction", xs, ys: r.influence}] : [])],
            {xlabel: "token position", ylabel: "norm"});
  $("#rec-summary").textContent = `${r.dependent_steps} dependent steps (${r.tokens.length} tokens x ${r.layers} ` +
    `layers); forward ${ms(r.forward.median_s).toFixed(2)} ms`;
  table($("#rec-table"), ["position", "token", "state norm", "step change", "influence"],
        r.tokens.map((t, i) => [i, show(t), r.state_norm[i], r.step_change[i], r.influence ? r.influence[i] : null]));
}
$("#rec-run").addEventListener("click", () => busy("Tracing the chain", loadRecurrence));

// --- start
$("#prompt-form").addEventListener("submit", e => {
  e.preventDefault();
  busy("Running the model", state.facts && state.facts.recurrent ? loadRecurrence : loadAttention);
});
$("#prompt").addEventListener("keydown", e => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); $("#prompt-form").requestSubmit(); }
});

(async () => {
  try {
    const r = await fetch("api/info", {headers: auth()});
    if (!r.ok) throw new Error((await r.json()).error.message);
    const f = state.facts = await r.json();
    $("#model-name").textContent = f.name;
    $("#model-facts").textContent = `${f.family}, ${f.layers} layers` + (f.heads ? ` x ${f.heads} heads` : "") +
      `, width ${f.dim}, ${(f.params / 1e6).toFixed(2)}M parameters, context ${f.max_seq_len}` +
      (f.kernel && !f.recurrent ? `, kernel ${f.kernel}, positions ${f.pos}` : "");
    $("#pages").hidden = !f.served;  // under `attnlab serve`: the page beside the server's own
    const asked = document.getElementById("tab-" + location.hash.slice(1));  // a report's link: #budget, #order…
    if (asked) openTab(asked);
    else if (f.recurrent) openTab($("#tab-recurrence"));
    document.body.dataset.ready = "1";
  } catch (e) {
    $("#error").textContent = "could not read the model's facts: " + e.message;
  }
})();
