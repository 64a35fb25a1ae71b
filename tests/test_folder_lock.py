"""A checkpoint folder is never clobbered: one run at a time (a real second process is refused), a lock left
by a SIGKILLed run is taken over, and a finished checkpoint is replaced only with --overwrite."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from attnlab.checkpoint import verify
from attnlab.folder_lock import LOCK_NAME, FolderInUse, FolderLock

HOLD = ("import sys, time\nfrom attnlab.folder_lock import FolderLock\nlock = FolderLock(sys.argv[1]).acquire()\n"
        "print('held', flush=True)\ntime.sleep(120)\n")
TRAIN = [sys.executable, "-m", "attnlab", "train", "--preset", "tiny", "--batch-size", "2", "--seq-len", "16",
         "--eval-every", "1000", "--threads", "1", "--quiet"]


def _wait_for_pid_in(lock_file, pid, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if lock_file.exists() and lock_file.read_text().strip() == str(pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never took {lock_file} (exit code {proc.poll()})")


def test_lock_is_exclusive_and_released(tmp_path):
    folder = tmp_path / "run"
    with FolderLock(folder) as lock:
        assert (folder / LOCK_NAME).read_text() == f"{os.getpid()}\n" and lock.stale_pid is None
        with pytest.raises(FolderInUse, match=rf"{folder} is in use by .*\(pid {os.getpid()}\)"):
            FolderLock(folder).acquire()  # a second open file description: refused even in one process
        (folder / "metrics.jsonl").write_text("")
    assert (folder / LOCK_NAME).read_text() == ""  # released: no pid left behind
    with FolderLock(folder) as again:
        assert again.stale_pid is None


def test_a_folder_the_lock_created_and_nobody_used_is_removed(tmp_path):
    with FolderLock(tmp_path / "new"):
        pass
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with FolderLock(tmp_path / "kept"):
        pass
    assert (tmp_path / "kept").is_dir()


def test_lock_of_a_sigkilled_process_is_taken_over(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"pid {holder.pid}\)"):
            FolderLock(folder).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (folder / LOCK_NAME).read_text().strip() == str(holder.pid)  # the dead run's pid is still written
    with FolderLock(folder) as lock:  # the kernel released its flock when it died
        assert lock.stale_pid == holder.pid
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())


def test_a_second_training_run_into_a_busy_folder_is_refused_and_a_killed_ones_lock_taken_over(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(TRAIN + ["--steps", "100000", "--save-every", "5", "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_pid_in(out / LOCK_NAME, first.pid, first)
        second = subprocess.run(TRAIN + ["--steps", "3", "--out", str(out)], capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 2, second.stderr
        assert f"{out} is in use" in second.stderr and f"pid {first.pid}" in second.stderr
        assert first.poll() is None, "the first run must not be disturbed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = subprocess.run(TRAIN + ["--steps", "3", "--out", str(out), "--overwrite", "--json"], capture_output=True,
                           text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["stale_lock_pid"] == first.pid
    assert f"pid {first.pid}" in third.stderr and "taken over" in third.stderr
    assert verify(out)["step"] == 3 and (out / LOCK_NAME).read_text() == ""


def test_a_finished_checkpoint_is_replaced_only_with_overwrite(tmp_path):
    out = tmp_path / "run"
    first = subprocess.run(TRAIN + ["--steps", "4", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    weights = (out / "model.safetensors").read_bytes()
    again = subprocess.run(TRAIN + ["--steps", "4", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and f"{out} already holds a checkpoint" in again.stderr
    assert "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (out / "model.safetensors").read_bytes() == weights and verify(out)["step"] == 4
    both = subprocess.run(TRAIN + ["--steps", "4", "--out", str(out), "--resume", "--overwrite"], capture_output=True,
                          text=True, timeout=300)
    assert both.returncode == 2 and "choose one" in both.stderr
    replaced = subprocess.run(TRAIN + ["--steps", "6", "--seed", "1", "--out", str(out), "--overwrite"],
                              capture_output=True, text=True, timeout=300)
    assert replaced.returncode == 0, replaced.stderr
    manifest = verify(out)
    assert manifest["step"] == 6 and (out / "model.safetensors").read_bytes() != weights
    assert LOCK_NAME not in manifest["files"] and "taken over" not in replaced.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and max(steps) == 6  # the old run's metrics went with its checkpoint


def test_a_refused_run_leaves_no_folder_behind(tmp_path):
    r = subprocess.run(TRAIN + ["--steps", "3", "--seq-len", "4096", "--pos", "learned", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "max_seq_len" in r.stderr
    assert not (tmp_path / "x").exists()
