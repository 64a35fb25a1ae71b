// The live page of `attnlab serve`: send a completion or a chat turn, watch its tokens arrive on a timeline,
// set the measured TTFT/TPOT beside the cost model's prediction, and watch the server's load.
// Plain ES modules (api.js talks to the server, draw.js draws), no framework, nothing loaded from elsewhere.
import { ApiFailure, failure, getJSON, headers, readEvents, useKey } from "./api.js";
import { drawHistory, drawTimeline, fmtBytes, fmtRate, fmtSeconds } from "./draw.js";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "attnlab.apiKey";
const HISTORY = 60;  // load samples kept: 30 s at one per 500 ms

const page = {
  info: null,        // GET /api/info
  messages: [],      // the conversation, sent whole each turn so the server's prefix cache reuses it
  run: null,         // the request in flight
  last: null,        // the latest request, in flight or finished: the figures show it
  charsPerToken: 4,  // for the prompt-length estimate until usage arrives; learned from each request
  history: [],       // load samples
  polling: false,
  frame: 0,
  pollTimer: null,
};

// -- one request ---------------------------------------------------------------------------------------------
async function send(event) {
  event.preventDefault();
  if (page.run) return;
  const text = $("prompt").value;
  const chat = $("mode-chat").checked;
  if (!text.trim()) { showError(chat ? "Type a message first." : "Type a prompt first."); return; }
  showError("");
  const common = { max_tokens: numberIn("max-tokens"), temperature: numberIn("temperature"), stream: true,
                   stream_options: { include_usage: true } };
  let url, body, run;
  if (chat) {
    const messages = [...page.messages, { role: "user", content: text }];
    url = "v1/chat/completions";
    body = { messages, ...common };
    const turn = addTurn(text);
    run = newRun("chat", messages.reduce((n, m) => n + m.content.length + 12, 0), turn.reply);
    Object.assign(run, { turn, userText: text });
    $("prompt").value = "";
  } else {
    url = "v1/completions";
    body = { prompt: text, ...common };
    $("output").querySelector(".prompt-echo").textContent = text;
    const gen = $("output").querySelector(".gen");
    gen.textContent = "";
    run = newRun("completion", text.length, gen);
  }
  page.run = page.last = run;
  setBusy(true);
  render();
  const ticker = setInterval(scheduleRender, 100);  // the wait for the first token visibly grows
  try {
    const response = await fetch(url, { method: "POST", headers: headers(true), body: JSON.stringify(body),
                                        signal: run.controller.signal });
    if (!response.ok) throw await failure(response);
    for await (const { data, now } of readEvents(response)) {
      if (data === "[DONE]") break;
      take(run, JSON.parse(data), now);
    }
    run.state = run.failure ? "failed" : "done";
    if (run.state === "failed") showError(`The server ended this request early: ${run.failure}`);
  } catch (err) {
    if (err.name === "AbortError") {
      run.state = "stopped";  // the server notices the closed connection and cancels the sequence
    } else {
      run.state = "error";
      showError(err instanceof ApiFailure ? err.message : `The server did not answer (${err.message}).`);
      if (err.status === 401) askForKey();
    }
  } finally {
    clearInterval(ticker);
    page.run = null;
    setBusy(false);
    finish(run);
  }
}

// A number field's value; an empty field is left out of the request, so the server's default applies (a value
// the server refuses comes back as its error message, shown as it is).
const numberIn = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));

function newRun(mode, promptChars, target) {
  return { mode, promptChars, target, sentAt: performance.now(), arrivals: [], text: "", usage: null, finish: null,
           failure: null,
           state: "streaming", prediction: null, predicting: false, predictionError: null, turn: null,
           controller: new AbortController() };
}

function take(run, chunk, now) {
  // A stream that fails, times out or is cut by a shutdown ends with an error event in OpenAI's shape.
  if (chunk.error) { run.failure = chunk.error.message || "unknown error"; scheduleRender(); return; }
  if (chunk.usage) run.usage = chunk.usage;
  const choice = chunk.choices && chunk.choices[0];
  if (!choice) return;
  const delta = run.mode === "chat" ? (choice.delta || {}) : null;
  if (delta && delta.role) return;  // chat's opening chunk names the role; no token yet
  const text = delta ? (delta.content || "") : (choice.text || "");
  if (text) { run.text += text; run.target.append(text); }
  if (choice.finish_reason) run.finish = choice.finish_reason;
  // Every chunk with a choice is one token's arrival, even when its text is held back (an unfinished UTF-8
  // character, a possible stop string).
  run.arrivals.push(now - run.sentAt);
  scheduleRender();
}

function finish(run) {
  if (run.usage && run.usage.prompt_tokens > 0) page.charsPerToken = run.promptChars / run.usage.prompt_tokens;
  if (run.mode === "chat") {
    if (run.state === "error" || run.state === "failed" || (run.state === "stopped" && !run.text)) {
      run.turn.user.remove();  // not part of the conversation: give the message back to edit and resend
      run.turn.assistant.remove();
      if (!$("prompt").value) $("prompt").value = run.userText;
    } else {
      page.messages.push({ role: "user", content: run.userText }, { role: "assistant", content: run.text });
    }
  }
  render();
  if (run.usage && run.usage.completion_tokens > 0) predictFor(run);
}

async function predictFor(run) {
  const u = run.usage;
  const query = new URLSearchParams({ prompt_tokens: u.prompt_tokens, output_tokens: u.completion_tokens,
                                      cached_tokens: cachedOf(u) });
  run.predicting = true;
  render();
  try {
    run.prediction = await getJSON(`api/predict?${query}`);
  } catch (err) {
    run.predictionError = err.message;
  }
  run.predicting = false;
  if (page.last === run) render();
  if (run.turn) renderTurn(run);
}

const cachedOf = (usage) => (usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens || 0 : 0);

// -- showing it ----------------------------------------------------------------------------------------------
// At most one redraw per frame, and none while nothing changes: on a CPU server the browser shares the cores
// with the engine it is timing.
function scheduleRender() {
  if (page.frame) return;
  page.frame = requestAnimationFrame(() => { page.frame = 0; render(); });
}

function measured(run) {
  const a = run.arrivals, n = a.length;
  const ttftS = n ? a[0] / 1e3 : null;
  const tpotS = n > 1 ? (a[n - 1] - a[0]) / (n - 1) / 1e3 : null;
  const rate = n ? n / (a[n - 1] / 1e3) : null;
  return { n, ttftS, tpotS, rate };
}

function render() {
  const run = page.last;
  if (!run) return;
  const m = measured(run);
  const u = run.usage, p = run.prediction;
  const waiting = run.state === "streaming";
  drawTimeline($("timeline"), {
    arrivalsMs: run.arrivals, waiting, elapsedMs: (waiting ? performance.now() - run.sentAt : 0),
    pred: p && { ttftMs: p.ttft_s * 1e3, tpotMs: p.tpot_s * 1e3 },
  });
  setFigure("ttft", fmtSeconds(m.ttftS), m.ttftS);
  setFigure("tpot", fmtSeconds(m.tpotS), m.tpotS);
  setFigure("tok-s", fmtRate(m.rate), m.rate);
  const perToken = page.info ? page.info.kv_bytes_per_token : null;
  const promptTokens = u ? u.prompt_tokens : Math.max(1, Math.round(run.promptChars / page.charsPerToken));
  if (perToken) {
    const tokens = promptTokens + m.n;
    const bytes = tokens * perToken;
    const block = page.info.kv_block_size;
    const blocks = block ? ` · ${Math.ceil(tokens / block)} blocks of ${block} held` : "";
    setFigure("kv-bytes", `${u ? "" : "≈ "}${fmtBytes(bytes)}${blocks}`, u ? bytes : null);
  } else {
    setFigure("kv-bytes", "…", null);
  }
  setFigure("srv-ttft", u ? fmtSeconds(u.ttft_s) : "…", u && u.ttft_s);
  setFigure("srv-tpot", u && u.completion_tokens > 1 ? fmtSeconds(u.tpot_s) : "…", u && u.tpot_s);
  const srvTotal = u ? u.ttft_s + Math.max(u.completion_tokens - 1, 0) * u.tpot_s : 0;
  setFigure("srv-tok-s", u && srvTotal > 0 ? fmtRate(u.completion_tokens / srvTotal) : "…", null);
  const predText = (v) => (p ? v : run.predicting ? "calibrating…" : run.predictionError ? "unavailable" : "…");
  setFigure("pred-ttft", predText(p && fmtSeconds(p.ttft_s)), p && p.ttft_s);
  setFigure("pred-tpot", predText(p && fmtSeconds(p.tpot_s)), p && p.tpot_s);
  setFigure("pred-tok-s", predText(p && fmtRate(u.completion_tokens / p.total_s)), null);
  setFigure("pred-kv-bytes", predText(p && fmtBytes(p.kv_bytes)), p && p.kv_bytes);
  $("pred-note").textContent = run.predictionError ? `Cost model: ${run.predictionError}`
    : p ? `Cost model (${p.hardware === "local" ? "this machine, calibrated" : p.hardware}): the compute alone; ` +
          "the measurements add HTTP, queueing and Python." : "";
  $("tokens").textContent = `${m.n} token${m.n === 1 ? "" : "s"} · prompt ` +
    (u ? `${u.prompt_tokens} tokens (${cachedOf(u)} from the prefix cache)`
      : `≈ ${promptTokens} tokens (estimated)`) +
    (run.finish ? ` · finish: ${run.finish}` : "");
  if (run.mode === "completion") $("output").dataset.tokens = String(m.n);
  const status = $("status");
  status.dataset.state = run.state;
  status.textContent = { streaming: m.n ? `streaming… ${m.n} tokens` : "waiting for the first token…",
                         done: `done: ${m.n} tokens`, stopped: `stopped after ${m.n} tokens`,
                         failed: "ended by the server", error: "error" }[run.state];
  if (run.turn) renderTurn(run);
}

function setFigure(id, text, value) {
  const node = $(id);
  node.textContent = text;
  if (value === null || value === undefined) delete node.dataset.value;
  else node.dataset.value = String(value);
}

function addTurn(text) {
  const log = $("chat-log");
  const user = document.createElement("li");
  user.className = "turn user";
  user.innerHTML = '<span class="role">You</span><div class="text"></div>';
  user.querySelector(".text").textContent = text;
  const assistant = document.createElement("li");
  assistant.className = "turn assistant";
  assistant.innerHTML = '<span class="role">Model</span><div class="text reply"></div><p class="turn-stats"></p>';
  log.append(user, assistant);
  assistant.scrollIntoView({ block: "nearest" });
  return { user, assistant, reply: assistant.querySelector(".reply"), stats: assistant.querySelector(".turn-stats") };
}

function renderTurn(run) {
  const stats = run.turn.stats, u = run.usage, p = run.prediction;
  if (!u) { stats.textContent = run.state === "streaming" ? "streaming…" : run.state; return; }
  const cached = cachedOf(u);
  const pct = u.prompt_tokens ? Math.round(100 * cached / u.prompt_tokens) : 0;
  const ttft = measured(run).ttftS;
  const model = p
    ? ` Cost model: TTFT ${fmtSeconds(p.ttft_s)} with the cache, ${fmtSeconds(p.ttft_uncached_s)} without.`
    : run.predicting ? " Cost model: calibrating…" : "";
  stats.textContent = `${cached} of ${u.prompt_tokens} prompt tokens from the prefix cache (${pct}%); ` +
    `TTFT ${fmtSeconds(ttft)} measured.${model}`;
  Object.assign(stats.dataset, { cached: String(cached), prompt: String(u.prompt_tokens) });
  if (run !== page.last) return;
  const hits = $("cache-hits");
  hits.textContent = `Last turn: ${cached} of ${u.prompt_tokens} prompt tokens served from the prefix cache` +
    (p ? `; TTFT ${fmtSeconds(p.ttft_s)} predicted with it, ${fmtSeconds(p.ttft_uncached_s)} without.` : ".");
  Object.assign(hits.dataset, { cached: String(cached), prompt: String(u.prompt_tokens) });
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("chat-reset").disabled = busy;
}

function setMode() {
  const chat = $("mode-chat").checked;
  $("chat-view").hidden = !chat;
  $("completion-view").hidden = chat;
  $("chat-reset").hidden = !chat;
  $("prompt-label").textContent = chat ? "Message" : "Prompt";
}

function resetChat() {
  page.messages = [];
  $("chat-log").replaceChildren();
  $("cache-hits").textContent = "No turns yet. Each turn resends the whole conversation; the server's prefix " +
    "cache should serve the earlier turns without recomputing them.";
  delete $("cache-hits").dataset.cached;
}

// -- the server: model facts and live load -------------------------------------------------------------------
async function loadInfo() {
  try {
    const info = page.info = await getJSON("api/info");
    $("model-name").textContent = info.model;
    $("model-summary").textContent = `${info.family}, ${info.dtype}, ${fmtCount(info.params)} parameters, ` +
      `context ${info.context ?? "unbounded"} tokens, on ${info.cpu}`;
    const facts = [["KV bytes per token", info.kv_bytes_per_token ? fmtBytes(info.kv_bytes_per_token) : "—"],
      ["KV block", info.kv_block_size ? `${info.kv_block_size} tokens` : "not paged"],
      ["max batch", info.max_batch], ["prefill chunk", info.prefill_chunk ?? "whole prompt"],
      ["chat template", info.chat_template], ["API key", info.auth ? "required" : "not required"]];
    $("model-info").replaceChildren(...facts.flatMap(([k, v]) => [textEl("dt", k), textEl("dd", String(v))]));
    $("api-key").placeholder = info.auth ? "required here" : "not needed here";
    return true;
  } catch (err) {
    $("model-summary").textContent = err.status === 401 ? "This server needs an API key: enter it above."
      : `Could not read /api/info: ${err.message}`;
    if (err.status === 401) askForKey();
    return false;
  }
}

async function pollLoad() {
  if (page.polling) return;  // one poll at a time; the running loop goes on by itself
  page.polling = true;
  clearTimeout(page.pollTimer);
  let waitMs = document.hidden ? 2000 : 500;
  try {
    renderLoad(await getJSON("api/load"));
    setStatus("load-status", "live", "live");
  } catch (err) {
    setStatus("load-status", err.status === 401 ? "needs the API key" : `unreachable (${err.message})`, "down");
    waitMs = err.status === 401 ? null : 3000;  // without a key, wait for one rather than ask again and again
  } finally {
    page.polling = false;
  }
  if (waitMs !== null) page.pollTimer = setTimeout(pollLoad, waitMs);
}

function renderLoad(load) {
  setFigure("load-running", `${load.running} of ${load.max_batch}`, load.running);
  setFigure("load-queued", `${load.queued} of ${load.max_queue}`, load.queued);
  const paged = load.kv_blocks_total !== undefined;
  const meter = $("load-blocks-meter");
  meter.hidden = !paged;
  if (paged) {
    const used = load.kv_blocks_used, total = load.kv_blocks_total;
    setFigure("load-blocks", `${used} used · ${load.kv_blocks_free} free of ${total}`, used);
    $("load-blocks-bar").style.width = `${(100 * used / Math.max(total, 1)).toFixed(2)}%`;
    meter.setAttribute("aria-valuenow", String(used));
    meter.setAttribute("aria-valuemax", String(total));
    $("load-blocks-note").textContent = `blocks of ${load.kv_block_size} tokens, ` +
      `${fmtBytes(load.kv_bytes_per_block)} each (${fmtBytes(used * load.kv_bytes_per_block)} in use)`;
  } else {
    setFigure("load-blocks", "not paged", null);
    $("load-blocks-note").textContent = "each sequence holds its own state";
  }
  setFigure("load-hit-rate", `${(100 * load.prefix_hit_rate).toFixed(1)}% (${fmtCount(load.cached_tokens)} of ` +
    `${fmtCount(load.prompt_tokens)} prompt tokens)`, load.prefix_hit_rate);
  setFigure("load-generated", fmtCount(load.generated_tokens), load.generated_tokens);
  setFigure("load-steps", fmtCount(load.steps), load.steps);
  setFigure("load-preemptions", fmtCount(load.preemptions), load.preemptions);
  page.history.push({ running: load.running, queued: load.queued,
                      kvFrac: paged ? load.kv_blocks_used / Math.max(load.kv_blocks_total, 1) : null });
  if (page.history.length > HISTORY) page.history.shift();
  drawHistory($("load-history"), page.history, HISTORY);
}

function setStatus(id, text, state) {
  $(id).textContent = text;
  $(id).dataset.state = state;
}

function askForKey() {
  $("key-box").classList.add("needed");
  $("api-key").focus();
}

const fmtCount = (n) => (n >= 1e6 ? `${(n / 1e6).toPrecision(3)}M` : n >= 1e4 ? `${(n / 1e3).toPrecision(3)}k`
  : String(n));

function textEl(name, text) {
  const node = document.createElement(name);
  node.textContent = text;
  return node;
}

// -- wiring --------------------------------------------------------------------------------------------------
function storedKey() {
  try { return localStorage.getItem(KEY_STORE) || ""; } catch { return ""; }
}

async function start() {
  $("key-box").classList.remove("needed");
  await loadInfo();
  pollLoad();
}

$("api-key").value = storedKey();
useKey($("api-key").value.trim());
$("api-key").addEventListener("change", () => {
  useKey($("api-key").value.trim());
  try { localStorage.setItem(KEY_STORE, $("api-key").value.trim()); } catch { /* storage off: keep it here */ }
  start();
});
$("request-form").addEventListener("submit", send);
$("stop").addEventListener("click", () => page.run && page.run.controller.abort());
$("chat-reset").addEventListener("click", resetChat);
for (const id of ["mode-completion", "mode-chat"]) $(id).addEventListener("change", setMode);
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); $("request-form").requestSubmit(); }
});
window.addEventListener("resize", () => { render(); drawHistory($("load-history"), page.history, HISTORY); });
document.addEventListener("visibilitychange", () => { if (!document.hidden) pollLoad(); });
setMode();
resetChat();
start();
