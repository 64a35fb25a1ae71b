"""``attnlab serve`` in a subprocess: a free loopback port, waited for until /health answers, stopped with SIGTERM.

Used by ``attnlab bench serve --launch``, benchmarks/serve_load.py and the tests, which all need a real server
in its own process (its own threads and GIL, as a user runs it).
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchedServer:
    """``attnlab serve FOLDER`` in a subprocess on a free loopback port: started and waited for (/health) on
    enter, stopped with SIGTERM on exit (``returncode`` then holds its exit status; a drained stop is 0)."""

    def __init__(self, folder: str, serve_args: list[str] = (), startup_s: float = 180.0, stop_s: float = 60.0):
        self.folder, self.serve_args = str(folder), list(serve_args)
        self.startup_s, self.stop_s = startup_s, stop_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.returncode: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "LaunchedServer":
        cmd = [sys.executable, "-m", "attnlab", "serve", self.folder, "--port", str(self.port), *self.serve_args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"attnlab serve exited with {self.proc.returncode} while starting:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"attnlab serve did not answer /health within {self.startup_s:.0f} s:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> int | None:
        if self.proc is not None and self.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.returncode = self.proc.wait()
        return self.returncode

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-4000:]
