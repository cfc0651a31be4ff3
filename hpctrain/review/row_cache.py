"""Finished runs' rows kept per sweep, so that ``status`` and ``hpctrain.load`` read one file for them, not
each run's record and summary (issue 31: 10,000 runs under 1 s on the login node).

What is kept: for each run whose record is final (completed, failed, cancelled, ...), what
:func:`hpctrain.review.runs.collect` worked out from its own files (record, metrics.json, and for a failure
its job's logs): state, note, step, metrics, error, the attempts' walls. What the queue, accounting and the
submitit folder say now (the cost, which log) is worked out again on every read, as for any run.

When a kept row is used: only while the stat key of every file it was built from is what it was (inode,
size, mtime, ctime of the record dir, metrics.json, a failure's logs), taken BEFORE those files were read.
A rerun's new event, a rewritten summary, a log that grew: the key differs, the run is read afresh and its
row kept again. A row is kept only when those files last changed :data:`SETTLE_S` before the read began:
a change within the file system's timestamp tick of the read (or of a clock a few seconds off, on a shared
file system) would leave the key as it was. A run still active is never kept: its state comes from the queue.

The file: ``<sweep>/.hpctrain/rows-<uid>.json``, one per user. Written only into a ``.hpctrain`` dir of the
reader's own (never into a colleague's sweep), mode 0600, by a new temp file (``O_EXCL``) renamed over it;
read only when it is a regular file (no link followed), the reader's, with no group or other permission, for
this sweep dir and this format. Anything else (another user's planted file, garbage) is ignored and replaced.
A file that cannot be written is no error: the next read reads the runs again.
"""

import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

from hpctrain.core import safefs
from hpctrain.core.paths import HPCTRAIN_DIR, METRICS, RECORD_DIR

VERSION = 2
SETTLE_S = 60.0  # a row is kept when its files last changed this long before the read (clock and tick slack)

# a run's facts (hpctrain.review.runs._run_facts), written as a list in this order: no key names repeated
FIELDS = ("job_id", "state", "note", "step", "max_steps", "loss", "elapsed_s", "restarts", "error", "metrics",
          "objective", "walls", "utilisation", "stage", "requeue_steps", "hardware")
_HARDWARE = FIELDS.index("hardware")  # the same few machines for thousands of runs: one table entry each
Key = List[Any]  # [job id, packed, stat of the record dir, of metrics.json, of the logs (failures only)...]


def _stat(path: str) -> Optional[str]:
    """What changes when the file does: ``inode:size:mtime:ctime`` (ns); None when it is missing. One string,
    not four numbers: 10,000 runs' keys are read back on every status."""
    try:
        st = os.lstat(path)  # a link in the file's place is a change, never followed
    except OSError:
        return None
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def run_key(run_dir: str, job_id: Optional[str], packed: bool) -> Key:
    """The key of a run's own files (its record dir, metrics.json): take it before reading them."""
    return [job_id, packed, _stat(f"{run_dir}/{RECORD_DIR}"), _stat(f"{run_dir}/{METRICS}")]  # no join: 10,000 runs


def with_logs(key: Key, logs: List[str]) -> Key:
    """``key`` and the stat of each log a failure's state and error may come from (take it before reading)."""
    return key + [_stat(p) for p in logs]


def file_for(sweep_dir: Path) -> str:
    return os.path.join(sweep_dir, HPCTRAIN_DIR, f"rows-{os.geteuid()}.json")


class RowCache:
    """The kept rows of one sweep, read once; :meth:`save` writes them back when they changed."""

    def __init__(self, sweep_dir: Path, header: Dict[str, Any]) -> None:
        self.sweep_dir = sweep_dir
        self.header = header  # what the rows depend on beyond their files: a different one drops them all
        self.rows: Dict[str, List[Any]] = {}  # run dir -> [key, facts]
        self.started_ns = time.time_ns()
        self.changed = False
        self.seen: Set[str] = set()

    def get(self, run_dir: str, key: Key, logs: Callable[[Dict[str, Any]], List[str]]) -> Optional[Dict[str, Any]]:
        """The kept facts of ``run_dir`` when its files are as they were; ``logs(facts)``: the log paths,
        asked only when the kept row is a failure's (its key holds their stats)."""
        self.seen.add(run_dir)
        kept = self.rows.get(run_dir)
        if kept is None:
            return None
        old = kept[0]
        if old[:4] == key and (len(old) == 4 or old == with_logs(key, logs(kept[1]))):
            return kept[1]
        del self.rows[run_dir]
        self.changed = True
        return None

    def keep(self, run_dir: str, key: Key, facts: Dict[str, Any]) -> None:
        """Keep a final run's facts under ``key`` when its files have settled (see the module doc)."""
        limit = self.started_ns - int(SETTLE_S * 1e9)
        times = [int(t) for s in key[2:] if s is not None for t in s.split(":")[2:]]  # mtime, ctime
        if key[2] is None or any(t >= limit for t in times):
            return
        self.rows[run_dir] = [key, facts]
        self.changed = True

    def save(self) -> None:
        """Write the rows back (only those of runs read this time) when anything changed; silent on failure."""
        gone = set(self.rows) - self.seen
        for run_dir in gone:
            del self.rows[run_dir]
        if not (self.changed or gone):
            return
        try:
            directory = _own_dir(os.path.join(self.sweep_dir, HPCTRAIN_DIR))
        except OSError:
            return
        path = file_for(self.sweep_dir)
        tmp = os.path.join(directory, f".rows-{os.geteuid()}.{os.getpid()}-{secrets.token_hex(3)}.tmp")
        data = json.dumps({**self.header, **_packed(self.rows)}, separators=(",", ":"), default=str).encode()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | safefs.NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _own_dir(path: str) -> str:
    """The sweep's ``.hpctrain`` when it is a directory of the reader's (made when missing in a sweep dir of
    theirs); :class:`~hpctrain.core.safefs.UnsafeFile` for another user's or a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if os.lstat(os.path.dirname(path)).st_uid != os.geteuid():
            raise safefs.UnsafeFile(f"{path}: not the reader's sweep") from None
        return str(safefs.own_dir(path))
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise safefs.UnsafeFile(f"{path}: not a directory of the reader's")
    return path


def load(sweep_dir: Path, header: Dict[str, Any]) -> RowCache:
    """The sweep's kept rows, when its file is the reader's own and was written for ``header``; else none."""
    cache = RowCache(sweep_dir, {"version": VERSION, **header})
    data = _read_own(file_for(sweep_dir))
    if isinstance(data, dict) and all(data.get(k) == v for k, v in cache.header.items()):
        try:
            cache.rows = _unpacked(data["rows"], data["hardware"])
        except (KeyError, TypeError, ValueError, IndexError):
            cache.rows = {}  # not what this version writes: read every run afresh
    return cache


def _packed(rows: Dict[str, List[Any]]) -> Dict[str, Any]:
    """The rows as written: each run's facts a list in FIELDS order, its hardware an index into a table."""
    table: Dict[str, int] = {}
    out = {}
    for run_dir, (key, facts) in rows.items():
        listed = [facts[f] for f in FIELDS]
        text = json.dumps(listed[_HARDWARE], sort_keys=True, default=str)
        listed[_HARDWARE] = table.setdefault(text, len(table))
        out[run_dir] = [key, listed]
    return {"hardware": [json.loads(t) for t in table], "rows": out}


def _unpacked(rows: Dict[str, List[Any]], hardware: List[Any]) -> Dict[str, List[Any]]:
    out = {}
    for run_dir, (key, listed) in rows.items():
        if len(listed) != len(FIELDS):
            raise ValueError(run_dir)
        facts = dict(zip(FIELDS, listed))
        facts["hardware"] = dict(hardware[listed[_HARDWARE]])  # each row its own dict, as a fresh read gives
        out[run_dir] = [key, facts]
    return out


def _read_own(path: str) -> Any:
    """The JSON in ``path`` when it is a regular file of the reader's that no one else may write; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | safefs.NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # planted (another user's), or made writable by others: not trusted
        with open(fd, "rb", closefd=False) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def header_of(sweep_dir: Path, submitit_folder: Path, launcher: str, search: bool) -> Dict[str, Any]:
    """What the kept rows depend on beyond each run's files."""
    return {"sweep": str(sweep_dir), "submitit": str(submitit_folder), "launcher": launcher, "search": search}

