"""The engine thread: one ``Engine`` stepped in a loop, fed by the HTTP side through an inbox.

Faults stay with their requests: the engine (``raise_faults=False``) ends a request whose own logits or sampling
fail, and the requests of a forward that fails, each with a last ``failed`` event its client sees as an error;
the thread goes on. ``healthy`` turns false when the thread has died or its last ``UNHEALTHY_AFTER`` steps all
failed.

Why a thread: a step is one batched forward (tens of milliseconds of torch work that releases the GIL), and
the asyncio loop must keep accepting, streaming and noticing disconnects meanwhile. Only this thread touches
the engine; the HTTP side posts "add" and "abort" into the inbox, which is applied between steps, so an aborted
request's blocks are free before the next step runs, and its last event (``cancelled``) comes from the engine
like any other. Each event reaches its request's asyncio queue; a step's events for every request go over in
one call onto the event loop (one wake-up per step, not one per token). What the worker reports about the
engine it reads from ``engine.stats()``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass

from attnlab.engine.engine import Engine
from attnlab.engine.request import FAILED, Event, Request

log = logging.getLogger("attnlab.serve")


def _trim_heap() -> None:
    """Going idle: hand the heap's free pages back to the OS (glibc's malloc_trim). A burst's activations (a
    ragged prefill of many prompts) leave freed memory in malloc's arenas; without this the resident size
    tracks the largest burst ever seen, which hides whether anything is really held (a leak)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):  # not glibc: nothing to trim
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


_libc = None


UNHEALTHY_AFTER = 3  # consecutive failed steps after which /health answers 503


class QueueFull(Exception):
    """More requests are waiting than --max-queue allows."""


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


@dataclass
class Totals:
    """Counters since start, read by /metrics and the page's load panel."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache instead of a prefill
    generated_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    step_errors: int = 0  # forwards that failed (their sequences ended with an error)
    sequence_errors: int = 0  # sequences ended alone by a fault of their own (non-finite logits, sampling)
    failed_streak: int = 0  # consecutive steps that failed


def _put_all(items: list) -> None:
    """On the event loop: one step's events into their requests' queues."""
    for queue, event in items:
        queue.put_nowait(event)


class Worker:
    def __init__(self, engine: Engine, *, max_queue: int):
        self.engine = engine
        self.max_queue = max_queue
        self.totals = Totals()
        self.accepting = True
        self._inbox: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._tickets = itertools.count()
        self._ids: dict[int, int] = {}  # the HTTP side's ticket -> the engine's request id
        self._listeners: dict[int, tuple] = {}  # engine id -> (event loop, asyncio queue, ticket)
        self._fresh: dict[int, int] = {}  # engine id -> prompt tokens, not yet counted in the totals
        self._stop = False
        self._idle = threading.Event()
        self._idle.set()
        self.thread = threading.Thread(target=self._run, name="attnlab-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- called from the HTTP side (any thread) -------------------------------------------------------------
    def submit(self, request: Request, loop, queue) -> int:
        """Queue a request (``engine.check``-ed by the caller); its events will be put on ``queue`` (an
        asyncio.Queue) from ``loop``'s thread. Returns the ticket that ``cancel`` takes."""
        with self._lock:
            if not self.accepting:
                raise Draining()
            if self.queued >= self.max_queue:
                raise QueueFull()
            ticket = next(self._tickets)
            self._inbox.append(("add", ticket, (request, loop, queue)))
            self._idle.clear()
        self._wake.set()
        return ticket

    def cancel(self, ticket: int) -> None:
        """End the request now; its last event (``cancelled``, or how it ended if that came first) still arrives."""
        with self._lock:
            self._inbox.append(("abort", ticket, None))
        self._wake.set()

    @property
    def queued(self) -> int:
        """Requests not yet admitted to a batch (the engine's waiting queue plus the inbox)."""
        return self.engine.stats()["waiting"] + sum(1 for kind, _, _ in list(self._inbox) if kind == "add")

    @property
    def running(self) -> int:
        st = self.engine.stats()
        return st["running"] + st["prefilling"]

    def snapshot(self) -> dict:
        t = self.totals
        st = self.engine.stats()
        out = {"running": st["running"] + st["prefilling"], "queued": self.queued, "max_queue": self.max_queue,
               "max_batch": st["max_batch"], "accepting": self.accepting,
               "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
               "prefix_hit_rate": t.cached_tokens / t.prompt_tokens if t.prompt_tokens else 0.0,
               "generated_tokens": t.generated_tokens, "preemptions": t.preemptions, "steps": t.steps,
               "step_errors": t.step_errors, "sequence_errors": t.sequence_errors, "healthy": self.healthy}
        out.update({k: v for k, v in st.items() if k.startswith("kv_")})
        return out

    @property
    def healthy(self) -> bool:
        """The engine thread is alive and its recent steps did not all fail."""
        return self.thread.is_alive() and self.totals.failed_streak < UNHEALTHY_AFTER

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is queued or running (or the timeout); True when idle."""
        return self._idle.wait(timeout_s)

    def stop(self) -> None:
        """Abort whatever is left (each request gets its last event) and end the thread."""
        self.accepting = False
        self._stop = True
        self._wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while True:
            self._apply_inbox()
            if self._stop:
                self._abort_all()
                return
            if not engine.has_work:
                if not self._idle.is_set():
                    _trim_heap()
                self._idle.set()
                self._wake.wait(0.25)
                self._wake.clear()
                continue
            errors_before = engine.stats()["step_errors"]
            events = engine.step()  # raise_faults=False: a fault ends requests, not this thread
            st = engine.stats()
            failed = st["step_errors"] > errors_before
            if failed:
                log.error("engine: %s", st["last_error"] or "a step failed")
            t = self.totals
            t.failed_streak = t.failed_streak + 1 if failed else 0
            t.steps += 1
            t.step_errors, t.sequence_errors = st["step_errors"], st["sequence_errors"]
            t.preemptions = st["preemptions"]
            t.generated_tokens += sum(1 for e in events if e.token is not None)
            self._deliver(events)

    def _apply_inbox(self) -> None:
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        refused = []
        for kind, ticket, payload in items:
            if kind == "add":
                request, loop, queue = payload
                try:
                    rid = self.engine.add(request)
                except Exception as e:  # noqa: BLE001 - the caller checked it; a refusal here is still its own
                    log.error("engine refused a checked request: %s: %s", type(e).__name__, e)
                    refused.append((loop, queue, e))
                    continue
                self._ids[ticket] = rid
                self._listeners[rid] = (loop, queue, ticket)
                self._fresh[rid] = len(request.prompt)
            elif ticket in self._ids:  # abort: frees the rows and blocks now, before the next step
                self.engine.abort(self._ids[ticket])
        for loop, queue, e in refused:  # no id, so no engine event: the request's only event says why
            self._post(loop, [(queue, Event(-1, FAILED, finish_reason="error", error=f"the engine refused the "
                                                                                    f"request: {e}"))])

    def _deliver(self, events: list[Event]) -> None:
        by_loop: dict = {}
        for event in events:
            rid = event.id
            if rid in self._fresh and (event.token is not None or event.done):
                # its first token (the prefill and any prefix-cache hit are done), or its end before one
                self.totals.prompt_tokens += self._fresh.pop(rid)
                self.totals.cached_tokens += event.cached_tokens
            sink = self._listeners.pop(rid, None) if event.done else self._listeners.get(rid)
            if sink is None:
                continue
            if event.done:
                self._ids.pop(sink[2], None)
            by_loop.setdefault(sink[0], []).append((sink[1], event))
        for loop, items in by_loop.items():
            self._post(loop, items)

    @staticmethod
    def _post(loop, items: list) -> None:
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop is closed (shutting down): nobody is listening
            pass

    def _abort_all(self) -> None:
        for rid in list(self._listeners):
            self.engine.abort(rid)
        self._deliver(self.engine.step())
        self._idle.set()
