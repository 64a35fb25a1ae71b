"""The server's live page in a real headless Chromium, against a real `attnlab serve` over loopback.

The server (a tiny random model, an API key required) runs as a subprocess; Chromium runs headless and is
driven through the Chrome DevTools Protocol (tests/cdp.py): typed text, real mouse clicks, network throttling,
viewport sizes, screenshots, and every console error, uncaught exception and browser log error collected.

Checked: tokens stream into the output and onto the timeline (one mark per token, the TTFT gap labelled),
the figures match the server's usage (KV bytes exactly), the cost model's prediction appears; a chat's second
turn is served from the prefix cache and says so; Stop ends a stream mid-way; server errors reach the user;
one column at 390 px, two on a wide screen, every field labelled; no console errors anywhere. Screenshots go
to this run's temporary folder, and to benchmarks/results when ATTNLAB_SAVE_SCREENSHOTS is set.
"""
import os
import re
import shutil
import urllib.parse
from pathlib import Path

import httpx
import pytest
from cdp import Page, open_page
from serving import Server, chromium, make_tiny_folder

REPO = Path(__file__).resolve().parents[1]
KEY = "page-test-key"  # the server requires it, so every call the page makes must carry it
AUTH = {"Authorization": f"Bearer {KEY}"}
NUMBER = re.compile(r"^\d+(\.\d+)? (µs|ms|s)$")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = make_tiny_folder(tmp_path_factory.mktemp("serve") / "page-tiny", n_files=5)
    s = Server(folder, "--api-key", KEY)
    try:
        yield {"base": s.url, "name": folder.name}
    finally:
        s.stop()
        s.kill()


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    if path is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def page(browser, server, tmp_path_factory):  # browser first: no chromium, no server started
    with open_page(browser, tmp_path_factory.mktemp("chromium")) as tab:
        # Without the key the page says so and stops polling; once it is typed in (and kept in localStorage for
        # every later page load) the page goes live.
        tab.call("Page.navigate", url=server["base"] + "/")
        tab.wait("document.querySelector('#key-box').classList.contains('needed') && "
                 "document.querySelector('#load-status').dataset.state === 'down'", "the page to ask for the key")
        assert "API key" in tab.text("#model-summary")
        tab.type("#api-key", KEY)
        tab.js("document.activeElement.blur()")  # commits the field: its change event
        tab.goto(server["base"] + "/")
        assert tab.js("localStorage.getItem('attnlab.apiKey')") == KEY
        yield tab


def _screenshot(page: Page, tmp_path_factory, name: str) -> None:
    """Into this run's temporary folder; also into benchmarks/results when ATTNLAB_SAVE_SCREENSHOTS is set."""
    shots = tmp_path_factory.getbasetemp() / "screenshots"
    shots.mkdir(exist_ok=True)
    page.screenshot(shots / name)
    assert (shots / name).stat().st_size > 10_000
    if os.environ.get("ATTNLAB_SAVE_SCREENSHOTS"):
        (REPO / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
        shutil.copy(shots / name, REPO / "benchmarks" / "results" / name)


def test_completion_streams_tokens_onto_the_timeline_with_figures(page, server):
    page.goto(server["base"] + "/")
    assert page.text("#model-name") == server["name"]
    prompt = "def parse(text):\n    return"
    page.type("#prompt", prompt)
    page.type("#max-tokens", "24")
    page.type("#temperature", "0")  # greedy: the same tokens every run
    page.click("#send")
    page.wait("document.querySelector('#status').dataset.state === 'done'", "the completion to finish")
    n = int(page.js("document.querySelector('#output').dataset.tokens"))
    usage = httpx.post(server["base"] + "/v1/completions", timeout=30, headers=AUTH,
                       json={"prompt": prompt, "max_tokens": 24, "temperature": 0}).json()["usage"]
    assert n == usage["completion_tokens"] >= 2
    assert page.text("#output .prompt-echo") == prompt and page.text("#output .gen")
    # the timeline: one mark per token, in arrival order, after the labelled wait for the first one
    xs = page.js("[...document.querySelectorAll('#timeline .tok')].map(c => +c.getAttribute('cx'))")
    assert len(xs) == n and xs == sorted(xs)
    assert page.text("#timeline .ttft-label").startswith("TTFT ")
    gap = page.js("+document.querySelector('#timeline .prefill').getAttribute('width')")
    assert gap > 0
    for fig in ("#ttft", "#tpot", "#srv-ttft"):
        assert NUMBER.match(page.text(fig)), (fig, page.text(fig))
    assert re.match(r"^\d+(\.\d+)? tok/s$", page.text("#tok-s"))
    info = httpx.get(server["base"] + "/api/info", headers=AUTH).json()
    kv_bytes = int(float(page.js("document.querySelector('#kv-bytes').dataset.value")))
    assert kv_bytes == (usage["prompt_tokens"] + n) * info["kv_bytes_per_token"]
    # the cost model's prediction for the same lengths (the first call calibrates the machine)
    page.wait("/^\\d/.test(document.querySelector('#pred-ttft').textContent)", "the cost model's prediction", 90)
    assert NUMBER.match(page.text("#pred-tpot"))
    assert page.js("document.querySelectorAll('#timeline .pred').length") == 1
    assert page.errors() == []


def test_chat_turns_reuse_the_prefix_cache(page, server, tmp_path_factory):
    page.goto(server["base"] + "/")
    page.click("#mode-chat")
    assert page.js("document.querySelector('#output').closest('[hidden]') !== null")
    page.type("#max-tokens", "8")
    page.type("#temperature", "0")
    turns = ["Explain how a key value cache makes decoding faster in a transformer model.",
             "And what does the prefix cache add?"]
    for i, message in enumerate(turns):
        page.type("#prompt", message)
        page.click("#send")
        page.wait(f"document.querySelectorAll('#chat-log .turn-stats[data-cached]').length === {i + 1} && "
                  "document.querySelector('#status').dataset.state === 'done'", f"chat turn {i + 1}")
    stats = page.js("[...document.querySelectorAll('#chat-log .turn-stats')].map(s => [+s.dataset.cached, "
                    "+s.dataset.prompt])")
    assert len(stats) == 2 and stats[0][0] == 0
    cached, prompt = stats[1]
    assert stats[0][1] <= cached < prompt  # the whole first prompt came back from the cache
    assert page.js("+document.querySelector('#cache-hits').dataset.cached") == cached
    assert page.js("document.querySelectorAll('#chat-log .turn.user').length") == 2
    page.wait("document.querySelector('#cache-hits').textContent.includes('without')", "the uncached prediction", 90)
    last = page.text("#chat-log .turn:last-child .turn-stats")
    assert "with the cache" in last and "without" in last, last
    load = httpx.get(server["base"] + "/api/load", headers=AUTH).json()  # the panel catches up in a poll or two
    page.wait(f"+document.querySelector('#load-generated').dataset.value === {load['generated_tokens']}",
              "the load panel to poll again", 5)
    assert page.js("+document.querySelector('#load-hit-rate').dataset.value") == pytest.approx(load["prefix_hit_rate"])
    _screenshot(page, tmp_path_factory, "serve_page_chat.png")
    assert page.errors() == []


def test_stop_aborts_a_stream_and_errors_reach_the_user(page, server):
    page.goto(server["base"] + "/")
    # slow the browser's network so the stream is still arriving when Stop is pressed
    page.call("Network.enable")
    page.call("Network.emulateNetworkConditions", offline=False, latency=0, downloadThroughput=3000,
              uploadThroughput=-1)
    try:
        page.type("#prompt", "class Parser:")
        page.type("#max-tokens", "200")
        page.type("#temperature", "0")  # greedy: a sampled end-of-text could finish the stream before Stop
        page.click("#send")
        page.wait("+document.querySelector('#output').dataset.tokens >= 3", "the first tokens", 30)
        assert page.js("document.querySelector('#status').dataset.state") == "streaming"  # shown as they arrive
        page.click("#stop")
        page.wait("document.querySelector('#status').dataset.state === 'stopped'", "the stop")
    finally:
        page.call("Network.emulateNetworkConditions", offline=False, latency=0, downloadThroughput=-1,
                  uploadThroughput=-1)
    assert 3 <= int(page.js("document.querySelector('#output').dataset.tokens")) < 200
    assert page.js("document.querySelector('#send').disabled") is False
    assert page.errors() == []
    page.type("#max-tokens", "100000")
    page.click("#send")
    page.wait("!document.querySelector('#error').hidden", "the error message")
    assert "above this server's cap" in page.text("#error")
    assert page.errors(ignore_network=True) == []  # the browser logs the 400 itself; nothing else


def test_layout_on_a_phone_and_a_wide_screen(page, server, tmp_path_factory):
    page.goto(server["base"] + "/")
    page.type("#prompt", "import json\n")
    page.type("#max-tokens", "48")
    page.click("#send")
    page.wait("document.querySelector('#status').dataset.state === 'done'", "the completion")
    page.wait("/^\\d/.test(document.querySelector('#pred-ttft').textContent)", "the prediction", 90)
    boxes = "['#request-panel', '#load-panel'].map(s => document.querySelector(s).getBoundingClientRect().left)"
    left, right = page.js(boxes)
    assert right > left + 400  # two columns
    assert "of" in page.text("#load-running") and page.text("#load-blocks").endswith("of 512")
    assert page.js("document.querySelector('#load-blocks-meter').getAttribute('aria-valuemax')") == "512"
    _screenshot(page, tmp_path_factory, "serve_page_desktop.png")
    page.viewport(390, 844, True)
    page.js("new Promise(r => requestAnimationFrame(() => r(0)))")
    left, right = page.js(boxes)
    assert left == right  # one column
    assert page.js("document.documentElement.scrollWidth") <= 390  # nothing wider than the phone
    unlabelled = page.js("[...document.querySelectorAll('input, textarea, select')].filter(e => !e.labels.length)"
                         ".map(e => e.id)")
    assert unlabelled == []
    _screenshot(page, tmp_path_factory, "serve_page_phone.png")
    page.viewport(1280, 900, False)
    assert page.errors() == []
