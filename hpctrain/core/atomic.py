"""Temp file + rename, and a lock beside a file: how hpctrain writes its own files.

Readers see the old file or the whole new one, never a part (as submitit's ``temporary_save_path``); a
write that fails leaves no temp file, and one that fails for want of space raises
:class:`~hpctrain.core.errors.DiskFullError` naming the file system.
A read-modify-write that two processes may do at once takes :func:`locked` first; its lock file is opened
without following a link (:mod:`hpctrain.core.safefs`). No torch here.
"""

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from hpctrain.core import safefs
from hpctrain.core.errors import disk_full

PathLike = Union[str, Path]

_UMASK = safefs.umask()


def _mkstemp_beside(parent: str, name: str) -> Tuple[int, str]:
    """``mkstemp`` in ``parent``, made (with its parents) only when missing: the common write into an
    existing directory makes no mkdir call (metrics.json is written every log step)."""
    try:
        return tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=".tmp")
    except FileNotFoundError:
        os.makedirs(parent, exist_ok=True)
        return tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=".tmp")


@contextmanager
def _temp_beside(path: PathLike, mode: Optional[int]) -> Iterator[Tuple[int, str]]:
    """A new temp file beside ``path`` (``O_EXCL``: never a name someone else planted) and its descriptor,
    its mode set through the descriptor; renamed onto ``path`` when the block ends well, removed otherwise.
    Plain strings, not pathlib: a pathlib join costs more than the write's own encoding."""
    parent, name = os.path.split(os.fspath(path))
    parent = parent or "."
    try:
        fd, tmp = _mkstemp_beside(parent, name)
    except OSError as exc:
        raise disk_full(exc, parent) or exc
    try:
        os.fchmod(fd, 0o666 & ~_UMASK if mode is None else mode)  # mkstemp makes 0600; others may read
        yield fd, tmp
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        full = disk_full(exc, parent)
        if full is not None and full is not exc:
            raise full from exc
        raise


@contextmanager
def replacing(path: PathLike, mode: Optional[int] = None) -> Iterator[Path]:
    """A temp path beside ``path``; renamed onto ``path`` when the block ends well, removed otherwise.
    For writers that need a file name of their own (``torch.save``). ``mode``: the file's, else the umask's
    (:func:`~hpctrain.core.safefs.exec_file_mode` for what a job executes or unpickles)."""
    with _temp_beside(path, mode) as (_, tmp):
        yield Path(tmp)


def write_bytes_atomic(path: PathLike, data: bytes, mode: Optional[int] = None) -> None:
    with _temp_beside(path, mode) as (fd, _):
        view = memoryview(data)
        while view:  # written through the descriptor mkstemp gave: never through a name swapped meanwhile
            view = view[os.write(fd, view):]


def write_text_atomic(path: PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # C; json.dumps(indent=...) runs Python's own encoder


def json_text(data: Any) -> str:
    """``data`` as JSON, one top-level key a line (people read these files), each value by the C encoder."""
    if not isinstance(data, dict) or not data or set(map(type, data)) != {str}:
        return _ENCODER.encode(data) + "\n"
    encode = _ENCODER.encode
    return "{\n" + ",\n".join(f" {encode(k)}: {encode(data[k])}" for k in sorted(data)) + "\n}\n"


def write_json_atomic(path: PathLike, data: Any) -> None:
    write_text_atomic(path, json_text(data))


def read_json(path: PathLike) -> Optional[Dict[str, Any]]:
    """A JSON object, or None when the file is missing, unreadable or holds something else."""
    try:
        with open(os.open(path, os.O_RDONLY | safefs.NOFOLLOW)) as f:  # a planted link is no record
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def locked(lock_path: PathLike) -> Iterator[None]:
    """An exclusive ``flock`` on a sidecar file, held for the block (released by the kernel if the holder dies).

    The lock is on the sidecar, never on the data file: the data file is replaced by rename, and a lock
    on a replaced inode would lock nothing.
    """
    try:
        fd = safefs.open_lock(lock_path, 0o666 & ~_UMASK)  # never through a planted link
    except FileNotFoundError:  # its directory is made only when missing: no mkdir call a write
        Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
        fd = safefs.open_lock(lock_path, 0o666 & ~_UMASK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
