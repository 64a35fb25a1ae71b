"""The engine thread: one ``Scheduler`` stepped in a loop, fed by the HTTP side through an inbox.

Faults stay with their requests: the scheduler ends a sequence whose own logits or sampling fail, and the
sequences of a forward that fails, each with a final event its client sees as an error; the thread goes on.
``healthy`` turns false when the thread has died or its last ``UNHEALTHY_AFTER`` steps all failed.

Why a thread: a step is one batched forward (tens of milliseconds of torch work that releases the GIL), and
the asyncio loop must keep accepting, streaming and noticing disconnects meanwhile. Only this thread touches
the scheduler and the KV pool; the HTTP side posts "submit" and "cancel" into the inbox, which is applied
between steps, so a cancelled sequence's blocks are free before the next step runs. Each token reaches its
request's asyncio queue; a step's events for every request go over in one call onto the event loop (one
wake-up per step, not one per token).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import traceback
from collections import deque
from dataclasses import dataclass

from attnlab.engine.scheduler import Event, Scheduler, Sequence

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
    def __init__(self, model, *, max_batch: int, max_queue: int, kv_blocks: int | None, block_size: int = 16,
                 prefill_chunk: int | None = None, prefill_budget: int | None = None, cache_dtype=None):
        cfg = model.cfg
        self.model = model
        self.max_queue = max_queue
        # paged with prefix caching where the model allows it: room for max_batch full contexts by default
        self.scheduler = Scheduler(model, max_len=cfg.max_seq_len, max_batch=max_batch, prefill_chunk=prefill_chunk,
                                   prefill_budget=prefill_budget, cache_dtype=cache_dtype, paged=True,
                                   kv_blocks=kv_blocks or max_batch * -(-cfg.max_seq_len // block_size),
                                   block_size=block_size, raise_faults=False)
        self.pool = self.scheduler.pool
        self.totals = Totals()
        self.accepting = True
        self._inbox: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._listeners: dict[int, tuple] = {}  # id(seq) -> (event loop, asyncio queue)
        self._fresh: set[int] = set()  # sequences whose prompt is not yet counted in the totals
        self._stop = False
        self._idle = threading.Event()
        self._idle.set()
        self.thread = threading.Thread(target=self._run, name="attnlab-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- called from the HTTP side (any thread) -------------------------------------------------------------
    def submit(self, seq: Sequence, loop, queue) -> None:
        """Queue seq; its events will be put on ``queue`` (an asyncio.Queue) from ``loop``'s thread."""
        with self._lock:
            if not self.accepting:
                raise Draining()
            if self.queued >= self.max_queue:
                raise QueueFull()
            self._inbox.append(("submit", seq, (loop, queue)))
            self._idle.clear()
        self._wake.set()

    def cancel(self, seq: Sequence) -> None:
        with self._lock:
            self._inbox.append(("cancel", seq, None))
        self._wake.set()

    @property
    def queued(self) -> int:
        """Requests not yet admitted to a batch (the scheduler's waiting queue plus the inbox)."""
        return self.scheduler.stats()["waiting"] + sum(1 for kind, _, _ in list(self._inbox) if kind == "submit")

    @property
    def running(self) -> int:
        st = self.scheduler.stats()
        return st["running"] + st["prefilling"]

    def snapshot(self) -> dict:
        t = self.totals
        st = self.scheduler.stats()
        out = {"running": st["running"] + st["prefilling"], "queued": self.queued, "max_queue": self.max_queue,
               "max_batch": self.scheduler.max_batch, "accepting": self.accepting,
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
        """Cancel whatever is left (each request gets its final event) and end the thread."""
        self.accepting = False
        self._stop = True
        self._wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        sched = self.scheduler
        while True:
            self._apply_inbox()
            if self._stop:
                self._cancel_all("cancelled")
                return
            if not sched.has_work:
                if not self._idle.is_set():
                    _trim_heap()
                self._idle.set()
                self._wake.wait(0.25)
                self._wake.clear()
                continue
            errors_before = sched.step_errors
            try:
                events = sched.step()
            except Exception:  # a bug outside any one forward: end everything in flight, keep serving
                log.error("engine step failed; ending the sequences in flight\n%s", traceback.format_exc())
                sched.step_errors += 1
                events = sched.fail([*sched.waiting, *sched.prefilling, *sched.running],
                                    "the engine failed while running this request; see the server log")
            failed = sched.step_errors > errors_before
            if failed:
                log.error("engine: %s", sched.last_error or "a step failed")
            t = self.totals
            t.failed_streak = t.failed_streak + 1 if failed else 0
            t.steps += 1
            t.step_errors, t.sequence_errors, t.preemptions = sched.step_errors, sched.seq_errors, sched.preemptions
            t.generated_tokens += sum(1 for e in events if e.token >= 0)
            self._deliver(events)

    def _apply_inbox(self) -> None:
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        for kind, seq, sink in items:
            if kind == "submit":
                self._listeners[id(seq)] = sink
                self._fresh.add(id(seq))
                self.scheduler.submit(seq)
            else:  # cancel: frees the row and its blocks now, before the next step (a finished one: a no-op)
                self.scheduler.cancel(seq)
                self._listeners.pop(id(seq), None)
                self._fresh.discard(id(seq))

    def _deliver(self, events: list[Event]) -> None:
        by_loop: dict = {}
        for event in events:
            seq = event.seq
            if id(seq) in self._fresh and (event.token >= 0 or event.finished):
                # its first token (the prefill and any prefix-cache hit are done), or its end before one
                self._fresh.discard(id(seq))
                self.totals.prompt_tokens += len(seq.prompt)
                self.totals.cached_tokens += seq.cached_tokens
            sink = self._listeners.pop(id(seq), None) if event.finished else self._listeners.get(id(seq))
            if sink is not None:
                by_loop.setdefault(sink[0], []).append((sink[1], event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed (shutting down): nobody is listening
                pass

    def _cancel_all(self, reason: str) -> None:
        sched = self.scheduler
        events = []
        for seq in [*sched.waiting, *sched.prefilling, *sched.running]:
            sched.cancel(seq, reason)
            events.append(Event(seq, -1, 0.0, True))
        self._deliver(events)
        self._idle.set()
