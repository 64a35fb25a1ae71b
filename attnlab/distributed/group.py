"""Process groups: joining one (under torchrun or ``attnlab train --nproc``) and running a function on P ranks.

One process per rank, each reading its place from the environment torchrun sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Backend: gloo on the CPU, NCCL on CUDA (one GPU per rank).

Where the rendezvous listens. torch's TCPStore server binds every interface whatever MASTER_ADDR says
(checked in /proc/net/tcp6 with torch 2.13), so local runs (``--nproc``, ``run_local``) meet through a
FileStore in a private temporary folder instead (``ATTNLAB_DIST_STORE``) and open no store listener at
all; gloo's own pair sockets are bound to the loopback interface (GLOO_SOCKET_IFNAME=lo) unless the user
set an interface or a non-loopback MASTER_ADDR. Under torchrun the rendezvous is torchrun's.

Failures: every collective has a timeout (``timeout_s``), so a rank that dies or hangs turns into an
error on its peers within that time rather than a hang.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnlab.errors import AttnlabError

LOOPBACK = "127.0.0.1"
STORE_ENV = "ATTNLAB_DIST_STORE"  # a FileStore path shared by the local ranks (set by the local launchers)
DEFAULT_TIMEOUT_S = 300.0


class DistributedError(AttnlabError):
    """A rank failed, hung past the timeout, or the group could not be formed."""


@dataclass
class DistContext:
    """Where this process sits: rank, world size, backend and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None: a single process, no process group
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def launched() -> bool:
    """True in a process started by torchrun or the local launchers (WORLD_SIZE in the environment)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def _loopback_env() -> None:
    addr = os.environ.get("MASTER_ADDR", LOOPBACK)
    if addr in (LOOPBACK, "localhost", "::1") or STORE_ENV in os.environ:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo listens on loopback only


def init_distributed(device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group described by the environment (a single-process context when there is none).

    ``device`` 'cuda' picks NCCL and the GPU LOCAL_RANK; 'cpu' picks gloo."""
    if not launched():
        return DistContext(device=device)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        if torch.cuda.device_count() <= local_rank:
            raise DistributedError(f"rank {rank}: NCCL needs one GPU per rank and local rank {local_rank} has none "
                                   f"({torch.cuda.device_count()} visible); run fewer processes per node")
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    _loopback_env()
    timeout = datetime.timedelta(seconds=timeout_s)
    if dist.is_initialized():
        return DistContext(rank, world, local_rank, dist.get_backend(), device)
    store = os.environ.get(STORE_ENV)
    if store:
        init = f"file://{store}"
    else:
        os.environ.setdefault("MASTER_ADDR", LOOPBACK)
        init = "env://"
    try:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timeout)
    except Exception as e:  # a peer that never came: say who is waiting and for what
        raise DistributedError(f"rank {rank}: could not join the process group of {world} ({backend}, "
                               f"{init}) within {timeout_s:.0f} s: {e}") from None
    return DistContext(rank, world, local_rank, backend, device)


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def fresh_store_path() -> str:
    """A FileStore path in a private temporary folder (the folder is removed with the store file by the OS
    temp cleaner; the launchers delete it when the run ends)."""
    return os.path.join(tempfile.mkdtemp(prefix="attnlab-dist-"), "store")


# ---- running a function on P local ranks (tests, experiments, benchmarks) ----------------------------------
def _rank_main(fn, rank, world, store, queue, timeout_s, threads, device, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), **{STORE_ENV: store})
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    try:
        init_distributed(device, timeout_s)
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))
        raise SystemExit(1)
    finally:
        destroy()


def run_local(fn, world: int, *args, timeout_s: float = 120.0, threads: int = 1, device: str = "cpu") -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes joined by gloo (NCCL with ``device`` 'cuda',
    one GPU per rank); return their results by rank.

    ``fn`` must be importable (a module-level function). A rank that raises, dies or runs past ``timeout_s``
    stops every rank and raises DistributedError naming it and the cause; no process is left behind."""
    import multiprocessing as mp
    import queue as queue_mod
    import shutil
    import time

    ctx = mp.get_context("spawn")
    store = fresh_store_path()
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, store, q, timeout_s, threads, device, args),
                         daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results, failure = {}, None
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world and failure is None:
            try:
                rank, status, value = q.get(timeout=0.2)
                if status == "ok":
                    results[rank] = value
                else:
                    failure = f"rank {rank} failed: {value}"
            except queue_mod.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in results and p.exitcode is not None and failure is None:
                    time.sleep(0.5)  # its report may still be in the queue
                    try:
                        while True:
                            rank, status, value = q.get_nowait()
                            if status == "ok":
                                results[rank] = value
                            elif failure is None:
                                failure = f"rank {rank} failed: {value}"
                    except queue_mod.Empty:
                        pass
                    if r not in results and failure is None:
                        failure = f"rank {r} died with {describe_exit(p.exitcode)} before reporting"
            if time.monotonic() > deadline and failure is None:
                failure = f"timed out after {timeout_s:.0f} s; ranks {sorted(set(range(world)) - set(results))} hung"
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    if failure:
        raise DistributedError(failure)
    return [results[r] for r in range(world)]


def describe_exit(code: int) -> str:
    """A process exit code in words: 'exit code 1' or 'signal SIGKILL'."""
    import signal

    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
