"""One writer per folder: an exclusive ``flock`` on a lock file inside it, held for a whole training run.

Why flock: the kernel drops the lock when its holder dies, however it dies (SIGKILL included), so a lock
can never outlive its run, and no pid or timestamp has to be trusted to decide whether a lock is stale.
The file holds the holder's pid, for the message a second run gets, and is emptied on release; a pid
still in it when the lock is free is the trace of a run that was killed, and is reported as taken over.
The file stays in the folder (it is removed only with a folder the lock itself created and nobody wrote
to; acquire() checks that the file it locked is still the one at the path, so two runs can never hold
two files of the same name). It is not part of a checkpoint: manifest.json lists only the files
checkpoint.py writes. POSIX only (fcntl).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from attnlab.errors import AttnlabError

LOCK_NAME = ".attnlab.lock"


class FolderInUse(AttnlabError):
    """Another live process holds the folder's lock."""


class FolderLock:
    """``with FolderLock(folder) as lock:`` — exclusive use of ``folder`` (created if missing) until the block
    ends. ``lock.stale_pid`` is the pid of a killed run whose lock was taken over, else None. A folder this
    lock created and nobody wrote to is removed again on release, so a run refused early leaves nothing."""

    def __init__(self, folder: str | Path, what: str = "an attnlab training run"):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self.stale_pid: int | None = None
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> "FolderLock":
        if self.folder.exists() and not self.folder.is_dir():
            raise AttnlabError(f"{self.folder} is a file, not a folder; choose another --out")
        self._created = not self.folder.exists()
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f"pid {holder}" if holder else "another process"
                raise FolderInUse(f"{self.folder} is in use by {self.what} ({who}); wait for it to finish, stop "
                                  "it, or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, self.path):
                break
            os.close(fd)  # a releasing run removed the file after we opened it: lock the one there now
        previous = _read_pid(fd)
        self.stale_pid = previous if previous and previous != os.getpid() else None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # a free lock with no pid in it: nobody was killed holding it
            if self._created and [p.name for p in self.folder.iterdir()] == [LOCK_NAME]:
                self.path.unlink()  # a run that opened it meanwhile sees it gone once it gets the lock (acquire)
                try:
                    self.folder.rmdir()
                except OSError:
                    pass  # another run has just put something in it: the folder is theirs now
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
