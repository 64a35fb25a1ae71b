"""The server's live page in a real headless Chromium, against a real `attnlab serve` over loopback.

The server (a tiny random model, an API key required) runs as a subprocess; Chromium runs headless with
``--remote-debugging-port=0`` and is driven through the Chrome DevTools Protocol (CDP) on the websocket it
names on stderr: typed text, real mouse clicks, network throttling, viewport sizes, screenshots, and every
console error, uncaught exception and browser log error collected. The websocket client below is a minimal
RFC 6455 one (text frames to and from a local browser are all CDP needs): ~60 lines of stdlib instead of a
test dependency that every CI install would fetch.

Checked: tokens stream into the output and onto the timeline (one mark per token, the TTFT gap labelled),
the figures match the server's usage (KV bytes exactly), the cost model's prediction appears; a chat's second
turn is served from the prefix cache and says so; Stop ends a stream mid-way; server errors reach the user;
one column at 390 px, two on a wide screen, every field labelled; no console errors anywhere. Screenshots go
to this run's temporary folder, and to benchmarks/results when ATTNLAB_SAVE_SCREENSHOTS is set.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
from serving import Server, chromium, make_tiny_folder

REPO = Path(__file__).resolve().parents[1]
KEY = "page-test-key"  # the server requires it, so every call the page makes must carry it
AUTH = {"Authorization": f"Bearer {KEY}"}
NUMBER = re.compile(r"^\d+(\.\d+)? (µs|ms|s)$")


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """End a process started here, then anything left in its process group (Chromium's helpers)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(10)


class _WebSocket:
    """Just enough of RFC 6455 for CDP: a client handshake, masked text frames out, frames in."""

    GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self, url: str, timeout_s: float):
        u = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          .encode())
        self.buf = bytearray()
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[:end]
        accept = base64.b64encode(hashlib.sha1((key + self.GUID).encode()).digest()).decode()
        if not head.startswith("HTTP/1.1 101") or accept not in head:
            raise ConnectionError(f"websocket handshake refused: {head!r}")

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the browser closed the DevTools connection")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        head += bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16
                                                     else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)  # a client must mask what it sends
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        self.sock.sendall(head + mask + masked)

    def send(self, text: str) -> None:
        self._frame(0x1, text.encode())

    def recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n >= 126:
                n = struct.unpack(">H" if n == 126 else ">Q", self._take(2 if n == 126 else 8))[0]
            mask = self._take(4) if b1 & 0x80 else None
            data = self._take(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the browser closed the DevTools connection")
            if opcode == 0x9:
                self._frame(0xA, data)  # ping -> pong
            elif opcode in (0x0, 0x1, 0x2):
                parts.append(data)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


class _Page:
    """One browser tab, reached through a flattened CDP session on the browser's websocket."""

    def __init__(self, ws: _WebSocket):
        self.ws, self.next_id, self.events, self.session = ws, 0, [], None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, timeout_s: float = 30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout_s
        while True:
            self.ws.sock.settimeout(max(deadline - time.monotonic(), 0.05))
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg["id"]:
                if "error" in reply:
                    raise RuntimeError(f"CDP {method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression: str, what: str, timeout_s: float = 30):
        deadline, failed = time.monotonic() + timeout_s, None
        while True:
            try:
                value = self.js(expression)
            except AssertionError as e:  # the page is still loading: its elements are not there yet
                value, failed = None, e
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; status: "
                                     f"{self.js('document.querySelector(`#status`)?.textContent')!r}, error: "
                                     f"{self.js('document.querySelector(`#error`)?.textContent')!r}") from failed
            time.sleep(0.1)

    def text(self, selector: str) -> str:
        return self.js(f"document.querySelector({json.dumps(selector)}).textContent")

    def goto(self, url: str) -> None:
        self.events.clear()  # each test checks the errors of its own page load
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && "
                  "document.querySelector('#load-status')?.dataset.state === 'live'",
                  "the page to load and its load panel to go live")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre (so a hidden or covered button would fail)."""
        box = self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView("
                      "{block: 'center'}); const r = e.getBoundingClientRect(); return [r.x + r.width / 2, "
                      "r.y + r.height / 2, r.width * r.height]; })()")
        assert box[2] > 0, f"{selector} is not visible"
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        self.js(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.focus(); e.select(); }})()")
        self.call("Input.insertText", text=text)

    def viewport(self, width: int, height: int, mobile: bool) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=mobile)

    def screenshot(self, path: Path) -> None:
        """The whole page: the viewport is stretched to the page's height for the capture, then put back."""
        width, height, full = self.js("[innerWidth, innerHeight, document.documentElement.scrollHeight]")
        self.viewport(width, full, width < 600)
        shot = self.call("Page.captureScreenshot", format="png", timeout_s=60)
        self.viewport(width, height, width < 600)
        path.write_bytes(base64.b64decode(shot["data"]))

    def errors(self, ignore_network: bool = False) -> list:
        """Console errors, uncaught exceptions and browser log errors seen so far."""
        self.js("0")  # read whatever events are waiting
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"])
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append(p["args"])
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                if not (ignore_network and p["entry"]["source"] == "network"):
                    out.append(p["entry"])
        return out


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
    tmp = tmp_path_factory.mktemp("chromium")
    err = open(tmp / "stderr.log", "w")
    proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             "--remote-debugging-port=0", f"--user-data-dir={tmp / 'profile'}",
                             "--window-size=1280,900", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    ws = None
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"DevTools listening on (ws://\S+)", (tmp / "stderr.log").read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "stderr.log").read_text()[-2000:]
            time.sleep(0.1)
        ws = _WebSocket(found.group(1), timeout_s=30)
        tab = _Page(ws)
        tab.viewport(1280, 900, False)
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
    finally:
        if ws is not None:
            ws.close()
        _stop(proc, 5)
        err.close()


def _screenshot(page: _Page, tmp_path_factory, name: str) -> None:
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
