"""Independent training runs side by side: one process of one thread per run.

The models the report trains are small (0.1-0.5M parameters), and a second thread speeds one of them up by
only 1.0-1.9x on 2 cores (measured per recall family, quiet machine, 2026-11-30), so two one-thread runs side
by side finish sooner than the same runs one after another on two threads. Runs go to worker processes
started with ``spawn`` (never fork a process that holds OpenMP threads); each returns plain data, such as a
model's ``state_dict`` on the CPU, which the parent loads. With one worker, or off the CPU, the runs happen in
this process, in order, on the threads in force.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from typing import Callable, Sequence

import torch


def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as runtime.set_threads does: denormals cost these CPUs 14x


def workers_for(device) -> int:
    """The report's thread budget (``--threads``, default one per core) spent as one thread per run; 1 off the CPU."""
    return torch.get_num_threads() if torch.device(device).type == "cpu" else 1


def map_runs(fn: Callable, jobs: Sequence[tuple], workers: int) -> list:
    """[fn(*job) for job in jobs], with up to ``workers`` jobs at a time in worker processes. ``fn`` must be a
    module-level function (it is pickled by name); jobs start in the order given, so put the longest first."""
    if workers <= 1 or len(jobs) <= 1:
        return [fn(*job) for job in jobs]
    with cf.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn"),
                                initializer=_one_thread) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        return [f.result() for f in futures]
