"""One submission at a time into a sweep dir: a lock held from choosing the submission's number (and which
runs are left to submit) to recording its job ids.

Without it two commands launched a second apart both read "nothing queued", both took submission-0 and
both submitted every run. A second command waits for the first (a Slurm submission takes seconds), then
sees the first's runs queued and leaves them alone; past ``WAIT_S`` (a local sweep holds the lock while it
runs) it says in one line that another submission is under way. The lock is an ``flock``: released by the
kernel when its holder dies, so a crashed launcher blocks nothing.
"""

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hpctrain._compat.submitit import private_pickles
from hpctrain.core import safefs
from hpctrain.core.paths import SUBMITIT_DIR, SweepPaths
from hpctrain.submit.errors import LaunchError

PID_WIDTH = 20  # wider than any pid
WAIT_S = float(os.environ.get("HPCTRAIN_SUBMIT_WAIT_S", "120"))


def lock_path(sweep_dir: Path) -> Path:
    return SweepPaths(sweep_dir).submit_lock


@contextmanager
def one_submission(sweep_dir: Path, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the sweep's submission lock for the block; wait up to ``wait_s`` for another holder."""
    path = lock_path(sweep_dir)
    private_pickles()
    problems = safefs.tree_problems(sweep_dir, os.getcwd())
    if problems:
        raise LaunchError(f"nothing submitted: {problems[0]}")
    try:
        for note in safefs.guard_tree(sweep_dir, os.getcwd()):
            print(f"hpctrain: {note}", file=sys.stderr)
        safefs.own_dir(path.parent)  # the payload and code snapshot live here: writable by the user alone
        safefs.own_dir(Path(sweep_dir) / SUBMITIT_DIR)  # submitit's pickles (its default folder)
        fd = safefs.open_lock(path)
    except safefs.UnsafeFile as exc:
        raise LaunchError(f"nothing submitted: {exc}") from None
    try:
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() > deadline:
                    raise LaunchError(f"nothing submitted: another submission into {sweep_dir} is under way "
                                      f"({holder}); run the same command again once it has ended") from None
                if not said:
                    print(f"hpctrain: another submission into {sweep_dir} is under way ({holder}); waiting for it",
                          file=sys.stderr, flush=True)
                    said = True
                time.sleep(0.5)
        # who holds it, for the line a waiter prints: a fixed width over the last holder's, never truncated
        os.pwrite(fd, f"{os.getpid():<{PID_WIDTH}}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _holder(fd: int) -> str:
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return f"pid {pid}" if pid.isdigit() else "pid unknown"
