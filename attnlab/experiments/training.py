"""The training stage: the models the chosen claims train, trained before any claim is timed, side by side.

A claim that trains models (3 and 8's recall families, 5's positional encodings, 13's speculative target, 14-16's
needle models (one per repetition), 18's neural recommenders) hands its training over as *tasks*: generators that yield a list of ``Job``s, receive the jobs' results
in the same order, and may yield again (a learning-rate sweep extended past its end, then more seeds at the best rate)
before they return, leaving what they trained in their module's cache. ``run_tasks`` spreads the jobs of every task over
one pool of one-thread worker processes, the lowest ``priority`` first: the longest jobs start first, so
the last ones to start are short, and no core waits on one claim's last job while another claim's could run. The
report runs this stage before its first claim (``prepare``), so the timing claims run on a quiet machine; a claim run
alone runs its own tasks the same way. Off the CPU, or with one thread, jobs run in this process, in order.

Why one thread per job: the models are small (0.1-6M parameters), and a second thread speeds one of them up by
only 1.0-1.9x on 2 cores, so two one-thread runs side by side finish sooner than the same runs one after another on
two threads. A job runs alone on its thread with its own seed, so what it trains does not depend on which jobs share
the pool (but it can differ in the last bits from the same run on two threads, whose sums round in another order).
Workers start with ``spawn`` (never fork a process that holds OpenMP threads) and return plain data, such as a
model's ``state_dict`` on the CPU, which the parent loads.
"""
from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Callable, Generator, Iterable

import torch

# Job priorities, lowest first: single long runs, then runs that may be followed by more runs of the same task (a
# sweep's extension, its seeds), then independent runs that can fill the cores at the end.
LONG, CHAINED, FILLER = 0, 1, 2


@dataclass(frozen=True)
class Job:
    fn: Callable  # module-level (a worker process finds it by name)
    args: tuple
    priority: int = CHAINED


Task = Generator[list, list, None]  # yields [Job], is sent [result], one per job, in order


def one_thread() -> None:
    """A worker's set-up: one thread, denormals flushed (as runtime.set_threads does: denormals cost these CPUs 14x)."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)


def workers_for(device) -> int:
    """The report's thread budget (``--threads``, default one per core) spent as one thread per job; 1 off the CPU."""
    return torch.get_num_threads() if torch.device(device).type == "cpu" else 1


def job_record(task, job: Job, start: float, end: float, t0: float) -> dict:
    """What the stage keeps of one finished job: its task, what it ran (the function and its plain arguments:
    family, rate, seed...), and when it started and how long it took, in seconds from the stage's start."""
    plain = [a for a in job.args if isinstance(a, (str, int, float))]
    return {"task": str(task), "job": f"{job.fn.__name__}({', '.join(map(str, plain))})",
            "start_s": round(start - t0, 2), "s": round(end - start, 2)}


def run_tasks(tasks: Iterable[Task], workers: int, names: list | None = None) -> list[dict]:
    """Run every task to its end, its jobs in up to ``workers`` one-thread processes at a time. Returns a record
    of every job (job_record; ``names``: the tasks' names in order), so a slow stage shows which jobs made it."""
    tasks = list(tasks)
    names = names or list(range(len(tasks)))
    t0, records = time.perf_counter(), []
    if workers <= 1 or not tasks:
        for name, task in zip(names, tasks):
            _inline(task, lambda job, a, b, name=name: records.append(job_record(name, job, a, b, t0)))
        return records
    order = itertools.count()
    ready: list = []  # heap of (priority, order, task index, slot)
    batches: dict = {}  # task index -> [results, jobs left, jobs]

    def advance(i: int, results) -> None:
        """Send task ``i`` its batch's results (None: start it) and queue the jobs it yields next, if any."""
        while True:
            try:
                jobs = next(tasks[i]) if results is None else tasks[i].send(results)
            except StopIteration:
                return
            if jobs:
                break
            results = []  # an empty batch is answered at once
        batches[i] = [[None] * len(jobs), len(jobs), jobs]
        for slot, job in enumerate(jobs):
            heapq.heappush(ready, (job.priority, next(order), i, slot))

    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=one_thread) as pool:
        running: dict = {}  # future -> (task index, slot, submitted at)
        for i in range(len(tasks)):
            advance(i, None)
        while ready or running:
            while ready and len(running) < workers:  # submitted one per free worker, so the heap decides what runs next
                _, _, i, slot = heapq.heappop(ready)
                job = batches[i][2][slot]
                running[pool.submit(job.fn, *job.args)] = (i, slot, time.perf_counter())
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in done:
                i, slot, start = running.pop(future)
                batch = batches[i]
                batch[0][slot] = future.result()
                records.append(job_record(names[i], batch[2][slot], start, time.perf_counter(), t0))
                batch[1] -= 1
                if batch[1] == 0:
                    del batches[i]
                    advance(i, batch[0])
    return records


def _inline(task: Task, done: Callable) -> None:
    results = None
    while True:
        try:
            jobs = next(task) if results is None else task.send(results)
        except StopIteration:
            return
        results = []
        for job in jobs:
            start = time.perf_counter()
            results.append(job.fn(*job.args))
            done(job, start, time.perf_counter())


def prepare(hooks, scale: str, device: str, workers: int | None = None, jobs: list | None = None) -> int:
    """Train what the claims need, all in one pool: each of ``hooks`` (a claim module's ``training(scale, device)``)
    gives its tasks by key, and a task two claims share (the same key) runs once. Returns how many tasks ran;
    ``jobs``, if given, receives every job's record (job_record)."""
    tasks: dict = {}
    for hook in hooks:
        for key, task in hook(scale, device).items():
            tasks.setdefault(key, task)
    records = run_tasks(tasks.values(), workers or workers_for(device), names=["/".join(map(str, k)) for k in tasks])
    if jobs is not None:
        jobs.extend(records)
    return len(tasks)
