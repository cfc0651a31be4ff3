"""Each rank's progress as a few integers in a node-local shared-memory file: the watchdog's only input.

A rank maps a small file in ``/dev/shm`` (a tmpfs: memory, never the shared file system) and the trainer
stores its step there once a step (one memoryview item store: no system call, no clock, no collective);
the phase (setup, train, eval, checkpoint, done) is stored only when it changes. The watchdog
(:mod:`hpctrain.job.watchdog`), a process of its own, reads the files with its own clock: a training
process stuck in a C call that holds the GIL cannot keep it from reading, nor from asking for the stacks.

Each rank also registers :mod:`faulthandler` on :data:`DUMP_SIGNAL` (a real-time signal: nothing else
sends it; USR2 is submitit's preemption signal, USR1 other frameworks'): its C handler writes every
thread's Python stack into the rank's ``.stack`` file beside the heartbeat, even while the main thread
holds the GIL. The watchdog copies those files into the run dir only when a hang is called.

The heartbeat begins with the app (:mod:`hpctrain.app`), before the process group, the model, the data and
the checkpoint load (the setup phase), so a rank stuck there is watched too; the trainer goes on with the same
one (:func:`for_this_rank` answers the process's open heartbeat).

Where: :data:`DIR_ENV`, set by the job wrapper for its run's attempt (one dir per run, job and restart), or by
the app itself when run directly (:mod:`hpctrain.job.direct`). Whoever starts the node's watchdog first writes
:data:`WATCHED` into that dir; a rank that does not find it there once its process group exists (a container
giving each task its own ``/dev/shm``) fails loudly (:class:`UnwatchedError`) rather than train unwatched.
No torch here.
"""

import faulthandler
import hashlib
import mmap
import os
import re
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
from enum import IntEnum
from pathlib import Path
from typing import IO, Any, List, MutableSequence, NamedTuple, Optional, cast

from hpctrain.core import liveness, safefs
from hpctrain.core.liveness import Liveness

DIR_ENV = "HPCTRAIN_HEARTBEAT_DIR"
DUMP_SIGNAL = signal.SIGRTMIN + 5  # faulthandler's: every thread's stack into the rank's .stack file
INTERRUPT_SIGNAL = signal.SIGRTMIN + 6  # a hang called: raise HangInterrupt in the main thread (if it runs Python)
SLOTS = 7  # step, phase, pid, main thread id, rank, node-local rank, the step this attempt's training began at
STEP, PHASE, PID, THREAD, RANK, LOCAL_RANK, START = range(SLOTS)
_FORMAT = f"{SLOTS}q"
SIZE = struct.calcsize(_FORMAT)


WATCHED = "watched"  # the marker the watchdog's starter writes in the dir before any rank of the node starts


class Phase(IntEnum):
    """What a rank is doing; each has its own allowance (:mod:`hpctrain.job.watchdog`)."""

    SETUP = 0  # the process group, the model and data, the checkpoint load: before the loop's first step
    TRAIN = 1
    EVAL = 2
    CHECKPOINT = 3
    DONE = 4  # the loop ended: nothing to watch


class HangInterrupt(RuntimeError):
    """Raised in a rank's main thread when the watchdog called its run hung and its owner (a search worker)
    lives on after the trial: the trial ends, the process does not."""


class UnwatchedError(RuntimeError):
    """This rank's heartbeat dir is not the one its node's watchdog reads: hang detection would be off for it."""


def _interrupted(signum: int, frame: Any) -> None:
    raise HangInterrupt("the hang watchdog ended this attempt (see the run's record and stacks/)")


class Beat(NamedTuple):
    step: int
    phase: Phase
    pid: int
    thread: int  # the main thread's id, as faulthandler prints it (``Thread 0x...``)
    rank: int
    local_rank: int
    start: int  # the step training began at in this attempt (a resumed run's checkpoint step)


def root() -> Path:
    """The node-local dir of this user's heartbeats: /dev/shm where there is one, else the temp dir."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"hpctrain-{os.getuid()}"


def node_name() -> str:
    """This node as Slurm names it (else the host's name)."""
    return (os.environ.get("SLURMD_NODENAME") or socket.gethostname()).replace("/", "_")


def dir_for(run_dir: "os.PathLike[str] | str", job_id: str) -> Path:
    """One attempt's heartbeat dir for a run on this node: the run, the job, Slurm's restart count (a requeue's
    files are not the last attempt's) and the node (nodes that share a /dev/shm, as the virtual nodes of one
    host do, each watch their own ranks)."""
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    digest = hashlib.sha1(os.path.abspath(run_dir).encode()).hexdigest()[:16]
    return root() / (f"{digest}-{job_id}-r{restart}".replace("/", "_") + f"-{node_name()}")


class Heart:
    """This rank's heartbeat: ``slots[STEP] = step`` is the whole per-step cost."""

    def __init__(self, directory: Path, rank: int, local_rank: int) -> None:
        # /dev/shm is every user's: a dir planted there by another (or a link) is refused, never written into
        safefs.own_dir(directory.parent, 0o700)
        safefs.own_dir(directory, 0o700)
        self.path = directory / f"rank{rank}-{os.getpid()}.beat"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.slots = cast(MutableSequence[int], memoryview(self._map).cast("q"))
        ident = threading.main_thread().ident or 0
        for slot, value in ((PHASE, Phase.SETUP), (STEP, -1), (PID, os.getpid()), (THREAD, ident), (RANK, rank),
                            (LOCAL_RANK, local_rank)):
            self.slots[slot] = int(value)
        stack = os.open(self.path.with_suffix(".stack"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | safefs.NOFOLLOW, 0o600)
        self._stack: Optional[IO[Any]] = os.fdopen(stack, "w")
        faulthandler.register(DUMP_SIGNAL, file=self._stack, all_threads=True, chain=False)
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(INTERRUPT_SIGNAL, _interrupted)

    def phase(self, phase: Phase) -> None:
        self.slots[PHASE] = int(phase)

    def check_watched(self) -> None:
        """Once the process group exists (every rank's starter has run by then): the node's watchdog reads this
        dir, or :class:`UnwatchedError`."""
        directory = self.path.parent
        if not (directory / WATCHED).exists():
            raise UnwatchedError(
                f"rank {self.slots[RANK]}: the hang watchdog of this node does not see {directory} (this task has a "
                f"/dev/shm of its own, as a container with --contain or `mount dev = minimal` gives each task): "
                f"bind the host's /dev/shm into the container, or set hang_timeout_s=0 to run without the watchdog")

    def close(self) -> None:
        """The loop ended (the process may yet run the end's records): DONE, and the dump handler off."""
        global _open
        if _open is self:
            _open = None
        self.slots[PHASE] = int(Phase.DONE)
        if self._stack is not None:
            faulthandler.unregister(DUMP_SIGNAL)
            self._stack.close()
            self._stack = None
            if self._previous is not None:
                signal.signal(INTERRUPT_SIGNAL, self._previous)


class NoHeart:
    """Outside a watched attempt: the same stores, into a list nobody reads."""

    def __init__(self) -> None:
        self.slots: MutableSequence[int] = [0] * SLOTS

    def phase(self, phase: Phase) -> None:
        self.slots[PHASE] = int(phase)

    def check_watched(self) -> None:
        return None

    def close(self) -> None:
        return None


_open: Optional[Heart] = None  # this process's heartbeat from the app's start to the loop's end


def mark_watched(directory: Path) -> None:
    """Said by whoever starts the node's watchdog, before the node's ranks start (:meth:`Heart.check_watched`);
    a dir planted by another user is refused (:class:`safefs.UnsafeFile`), as the ranks refuse it."""
    safefs.own_dir(directory.parent, 0o700)
    safefs.own_dir(directory, 0o700)
    prune_earlier(directory)
    fd = os.open(directory / WATCHED, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | safefs.NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def prune_earlier(directory: Path) -> List[Path]:
    """Remove this run's earlier attempts' heartbeat dirs on this node (another job id or restart count): a
    watchdog killed outright (srun at a time limit, scancel) leaves its dir in /dev/shm, which is memory. Only
    dirs of ours that nobody else can write and whose ranks are all gone; other runs' and nodes' are left."""
    digest = directory.name.split("-", 1)[0]
    node = node_name()
    attempt = re.compile(rf"{re.escape(digest)}-.+-r\d+-{re.escape(node)}")
    removed: List[Path] = []
    if not attempt.fullmatch(directory.name) or not trusted(directory):
        return removed
    try:
        siblings = sorted(directory.parent.iterdir())
    except OSError:
        return removed
    for other in siblings:
        if other == directory or not attempt.fullmatch(other.name) or not trusted(other):
            continue
        # a rank that runs, or one its query cannot answer for, keeps the dir (liveness: never read as gone)
        if all(liveness.process(b.pid) is Liveness.GONE for b in (read(f) for f in beats(other)) if b is not None):
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def for_this_rank(rank: int, local_rank: int) -> "Heart | NoHeart":
    """This rank's heartbeat where a dir was set for it: the process's open one (the app's, begun in setup),
    else a new one; a stand-in elsewhere, or when it cannot be made (a full /dev/shm must not stop the run)."""
    global _open
    where = os.environ.get(DIR_ENV)
    if not where:
        return NoHeart()
    if _open is not None and _open.path.parent == Path(where):
        _open.slots[RANK], _open.slots[LOCAL_RANK] = rank, local_rank
        return _open
    try:
        _open = Heart(Path(where), rank, local_rank)
    except safefs.UnsafeFile as exc:  # said: hang detection is off for this attempt, and why
        print(f"hpctrain: rank {rank}: no heartbeat, the hang watchdog cannot see this rank: {exc}",
              file=sys.stderr, flush=True)
        return NoHeart()
    except OSError:
        return NoHeart()
    return _open


def read(path: Path) -> Optional[Beat]:
    """One rank's heartbeat as the watchdog reads it; None for a file not (yet) whole."""
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return None
    if len(data) < SIZE:
        return None
    step, phase, pid, thread, rank, local_rank, start = struct.unpack(_FORMAT, data)
    try:
        return Beat(step, Phase(phase), pid, thread, rank, local_rank, start)
    except ValueError:
        return None


def trusted(directory: Path) -> bool:
    """A heartbeat dir of this user's, in a dir of this user's, that nobody else can write: the pids in its
    files are signalled."""
    for where in (directory, directory.parent):
        try:
            st = os.lstat(where)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
    return True


def beats(directory: Path) -> List[Path]:
    """The ranks' heartbeat files; none from a dir another user could have planted or written."""
    if not trusted(directory):
        return []
    try:
        return sorted(p for p in directory.iterdir() if p.suffix == ".beat")
    except OSError:
        return []
