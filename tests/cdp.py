"""Chromium driven through the Chrome DevTools Protocol (CDP), for tests of pages in a real headless browser.

Chromium runs headless with ``--remote-debugging-port=0`` and is driven on the websocket it names on stderr: typed
text, real mouse clicks, viewport sizes, screenshots, and every console error, uncaught exception and browser log
error collected. The websocket client is a minimal RFC 6455 one (text frames to and from a local browser are all CDP
needs): ~60 lines of stdlib instead of a test dependency that every CI install would fetch.
"""
import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.parse
from pathlib import Path


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
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


class WebSocket:
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


class Page:
    """One browser tab, reached through a flattened CDP session on the browser's websocket."""

    def __init__(self, ws: WebSocket):
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


@contextlib.contextmanager
def open_page(browser: str, tmp: Path, width: int = 1280, height: int = 900):
    """A headless Chromium with one tab at ``width`` x ``height``: yields its Page; the browser and its helpers
    are stopped on exit."""
    err = open(tmp / "stderr.log", "w")
    proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                             "--disable-background-networking", "--disable-component-update", "--disable-sync",
                             "--remote-debugging-port=0", f"--user-data-dir={tmp / 'profile'}",
                             f"--window-size={width},{height}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    ws = None
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"DevTools listening on (ws://\S+)", (tmp / "stderr.log").read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "stderr.log").read_text()[-2000:]
            time.sleep(0.1)
        ws = WebSocket(found.group(1), timeout_s=30)
        tab = Page(ws)
        tab.viewport(width, height, width < 600)
        yield tab
    finally:
        if ws is not None:
            ws.close()
        stop_process(proc, 5)
        err.close()
