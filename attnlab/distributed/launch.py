"""``attnlab ... --nproc N``: N local processes running the same command, under a watchdog.

Each child is ``python -m attnlab <the same arguments>`` with the environment torchrun would give it
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so the code that runs is exactly the code that runs under
``torchrun --nproc-per-node N -m attnlab ...``; the children meet through a FileStore in a private
temporary folder (no network listener; see group.py).

The watchdog: the first child to exit non-zero (an error, a crash, a kill) stops the others (SIGTERM, then
SIGKILL after ``grace_s``) and the launcher exits 1 with a line naming that rank and its cause (its exit
code or signal and the last line it wrote to stderr). A rank that hangs is caught by its peers'
collective timeout (``--dist-timeout``), which makes them exit and the watchdog stop it. Children die with
the launcher (PR_SET_PDEATHSIG on Linux), so none is orphaned even if the launcher is killed.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from attnlab.distributed.group import STORE_ENV, describe_exit, fresh_store_path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _pump(stream, rank: int, last: list, out) -> None:
    """Copy a child's stderr to ours, each line prefixed with its rank; keep its last non-empty line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if line.strip():
            last[rank] = line.strip()
        out.write(f"[rank {rank}] {line}\n")
        out.flush()
    stream.close()


def launch(argv: list[str], nproc: int, grace_s: float = 5.0, threads: int | None = None) -> int:
    """Run ``python -m attnlab *argv`` as ``nproc`` ranks; return 0 if all succeed, else 1 (after stopping all).

    ``threads``: torch threads per rank (default: the machine's cores divided among the ranks)."""
    store = fresh_store_path()
    per_rank = threads or max(1, (os.cpu_count() or 1) // nproc)
    procs, pumps, last = [], [], [""] * nproc
    try:
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(nproc), OMP_NUM_THREADS=str(per_rank), **{STORE_ENV: store})
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            procs.append(subprocess.Popen([sys.executable, "-m", "attnlab", *argv], env=env, stderr=subprocess.PIPE,
                                          stdout=None if rank == 0 else subprocess.DEVNULL,
                                          preexec_fn=_die_with_parent))
        for rank, p in enumerate(procs):  # threads only once every child is forked (preexec_fn and threads mix badly)
            t = threading.Thread(target=_pump, args=(p.stderr, rank, last, sys.stderr), daemon=True)
            t.start()
            pumps.append(t)
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                if p.poll() not in (None, 0):
                    failed = rank
                    break
            time.sleep(0.05)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode != 0), None)
        if failed is None:
            return 0
        code = procs[failed].returncode
        alive = [r for r, p in enumerate(procs) if p.poll() is None]  # a hung rank is among these
        _stop(procs, grace_s)
        for t in pumps:
            t.join(1)
        others = [f"{r}: {describe_exit(p.returncode)}" for r, p in enumerate(procs) if r != failed]
        print(f"attnlab: rank {failed} of {nproc} failed first ({describe_exit(code)}): "
              f"{last[failed] or 'no message'}; still running then: ranks {alive or 'none'}; the other ranks were "
              f"stopped ({'; '.join(others)})",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _stop(procs, grace_s)
        return 130
    finally:
        _stop(procs, grace_s)
        shutil.rmtree(os.path.dirname(store), ignore_errors=True)


def _stop(procs, grace_s: float) -> None:
    """SIGTERM every live child, then SIGKILL what is left after ``grace_s``; reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.send_signal(signal.SIGCONT)  # a stopped (frozen) process acts on SIGTERM only once continued
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
