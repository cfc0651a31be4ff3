"""The study's journal file kept readable after a torn write (a node lost in the middle of an append).

Optuna's ``JournalFileBackend`` appends whole lines under its file lock. A writer killed mid-append
leaves a last line without its newline (or cut short); the next append is then glued onto it, and every
reader dies of ``JSONDecodeError`` once a line follows the broken one. Two repairs, both under the
journal's own lock:

- before every append (:class:`RepairingOpenLock`, the lock Optuna takes to append): a last line that is
  not a whole JSON line is moved to the side file ``study.journal.torn``;
- when a study is opened (:func:`repair`): every line that is not JSON is set aside, keeping a whole log
  glued onto a fragment (the fragment goes to the side file, the log stays). Where the study's own first
  line (``create_study``) was the one set aside, it is written again (the study's name, its direction from
  the fragment or from ``sweep.json``): without it Optuna drops every trial after it and numbers the next
  trials from 0 again, over the earlier trials' run dirs, and ``status`` loses them (the best one too).

Each repair is reported once, in one line naming the side file.

The journal's lock and the study's ``trials`` lock are Optuna's ``O_EXCL`` lock file with its grace period,
their waiters looking again within a few milliseconds (:class:`PromptOpenLock`): Optuna's own waiter doubles
its sleep up to 1 s, so a lock held 20 ms cost a waiter up to 20 ms more (270 ms were seen with 4 workers).
"""

import json
import os
import re
import sys
import time
from typing import Callable, List, Optional

from optuna.storages.journal import JournalFileOpenLock

from hpctrain._compat.optuna import lock_file
from hpctrain.core.atomic import read_json
from hpctrain.core.paths import SWEEP_MANIFEST

TORN_SUFFIX = ".torn"
LOG_START = b'{"op_code":'  # how Optuna writes every log (json.dumps, compact separators)
TAIL_BYTES = 1 << 16  # the last line of a journal is far shorter than this
LOCK_POLL_MAX_S = 0.004  # a waiter looks again at least this often (its sleep doubles from 0.5 ms to this)


def side_file(path: str) -> str:
    return path + TORN_SUFFIX


def _whole(line: bytes) -> bool:
    if not line.endswith(b"\n"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _set_aside(path: str, fragments: List[bytes]) -> str:
    side = side_file(path)
    with open(side, "ab") as f:
        for frag in fragments:
            f.write(frag if frag.endswith(b"\n") else frag + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return side


def _report(path: str, nbytes: int, side: str) -> str:
    return (f"hpctrain: the study journal {path} ended in a torn write ({nbytes} bytes, a writer lost "
            f"mid-append): set aside in {side}; the study goes on")


def cut_torn_tail(path: str) -> Optional[str]:
    """Move a last line that is not whole JSON to the side file (call under the journal's lock); the
    one-line report, or None when the tail is whole."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size == 0:
        return None
    with open(path, "rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None  # every append ends with its newline: a whole last write (one byte read)
        start = max(0, size - TAIL_BYTES)
        f.seek(start)
        tail = f.read()
    cut = tail.rfind(b"\n") + 1  # the start of the last line, in tail
    if cut == 0 and start > 0:
        return None  # a last line longer than TAIL_BYTES: not a journal we wrote; left to repair()
    last = tail[cut:]
    if _whole(last + b"\n"):
        with open(path, "ab") as f:  # only the newline was lost: the log itself is whole
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return None
    side = _set_aside(path, [last])
    with open(path, "r+b") as f:
        f.truncate(start + cut)
        f.flush()
        os.fsync(f.fileno())
    return _report(path, len(last), side)


def repair(path: str, lock: JournalFileOpenLock, say: Callable[[str], None]) -> Optional[str]:
    """Set aside every line of the journal that is not JSON (under ``lock``), saying so in one line."""
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        if all(_whole(line) for line in f):
            return None  # the common case: nothing to do, the lock not taken
    lock.acquire()
    try:
        with open(path, "rb") as f:
            lines = f.readlines()
        kept: List[bytes] = []
        fragments: List[bytes] = []
        for line in lines:
            if not line.endswith(b"\n") and _whole(line + b"\n"):
                line += b"\n"  # only the newline was lost
            if _whole(line):
                kept.append(line)
                continue
            glued = line.rfind(LOG_START, 1)  # a whole log appended onto a torn one
            if glued > 0 and _whole(line[glued:]):
                fragments.append(line[:glued])
                kept.append(line[glued:])
            else:
                fragments.append(line)
        if not fragments:
            if kept != lines:
                _rewrite(path, kept)
            return None
        side = _set_aside(path, fragments)
        rebuilt = _study_line(path, kept, fragments)
        _rewrite(path, [rebuilt] + kept if rebuilt else kept)
    finally:
        lock.release()
    message = _report(path, sum(len(x) for x in fragments), side)
    say(message)
    return message


CREATE_STUDY = 0  # Optuna's op code of a study's first log
STUDY_NAME = "search"  # hpctrain.search.study.STUDY_NAME (study imports this module; a test keeps them equal)
DIRECTIONS = {"minimize": 1, "maximize": 2}  # optuna.study.StudyDirection values, as the journal holds them


def _op(line: bytes) -> Optional[int]:
    try:
        op = json.loads(line).get("op_code")
    except (ValueError, AttributeError):
        return None
    return op if isinstance(op, int) else None


def _study_line(path: str, kept: List[bytes], fragments: List[bytes]) -> Optional[bytes]:
    """The ``create_study`` log to put back first, where the journal has logs of a study but lost its first
    line; None where it has it (or holds nothing)."""
    ops = [_op(line) for line in kept]
    if not ops or ops[0] == CREATE_STUDY:
        return None
    torn = b"".join(fragments)
    direction = next((code for name, code in DIRECTIONS.items() if b'"directions":[%d' % code in torn), None)
    if direction is None:  # the sweep's own record of its search (sweep.json beside .hpctrain)
        search = (read_json(os.path.join(os.path.dirname(os.path.dirname(path)), SWEEP_MANIFEST)) or {}).get("search")
        direction = DIRECTIONS.get(str((search or {}).get("direction") or "minimize"), 1)
    named = re.search(rb'"study_name":("(?:[^"\\]|\\.)*")', torn)
    log = {"op_code": CREATE_STUDY, "worker_id": "hpctrain-repair",
           "study_name": json.loads(named.group(1)) if named else STUDY_NAME,
           "directions": [direction]}
    return (json.dumps(log, separators=(",", ":")) + "\n").encode()


def _rewrite(path: str, lines: List[bytes]) -> None:
    tmp = f"{path}.repair.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class PromptOpenLock(JournalFileOpenLock):
    """Optuna's ``O_EXCL`` lock file, broken as Optuna breaks it (unchanged for ``grace_period`` seconds: left
    by a killed process), its waiter looking again at least every ``LOCK_POLL_MAX_S``."""

    def acquire(self) -> bool:
        path = lock_file(self)
        sleep_s, mtime, since = 0.0005, None, time.monotonic()
        while True:
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return True
            except FileExistsError:
                pass
            if self.grace_period is not None:
                try:
                    current = os.stat(path).st_mtime
                except OSError:
                    continue  # released meanwhile: try again at once
                if current != mtime:
                    mtime, since = current, time.monotonic()
                if time.monotonic() - since > self.grace_period:
                    try:
                        self.release()  # not touched for the grace period: its holder is gone
                    except RuntimeError:
                        pass  # another waiter broke it first
                    continue
            time.sleep(sleep_s)
            sleep_s = min(sleep_s * 2, LOCK_POLL_MAX_S)


class RepairingOpenLock(PromptOpenLock):
    """Optuna's ``O_EXCL`` lock; once held, a torn last line is set aside before Optuna appends."""

    def __init__(self, journal: str, grace_period: int, say: Callable[[str], None] = _stderr) -> None:
        super().__init__(journal, grace_period=grace_period)
        self.journal, self.say = journal, say

    def acquire(self) -> bool:
        got = super().acquire()
        try:
            message = cut_torn_tail(self.journal)
        except OSError:
            message = None  # shared storage hiccup: Optuna's append reports its own error
        if message:
            self.say(message)
        return got
