"""Opening files in a sweep dir on a shared file system: no planted link followed, nothing executed that
another user could have written.

A sweep dir often lies in a group project space (umask 002, setgid dirs): a colleague may create a name
before hpctrain does (a symlink at a lock file, at a log), or rewrite a group-writable module or pickle a
job is about to load. So: new files are made with ``O_EXCL`` and every open here uses ``O_NOFOLLOW``; a
lock file is opened, checked with ``fstat`` (a regular file of ours) and never truncated; what a job
executes or unpickles gets an explicit mode without group or other write (:func:`exec_file_mode`);
readers take a file only where it really lies inside the sweep dir (:func:`read_inside`). No torch here.
"""

import os
import pwd
import stat
from pathlib import Path
from typing import Callable, List, Optional, Tuple, Union

PathLike = Union[str, Path]
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A file or directory hpctrain refuses to open: a link, another user's, not a regular file."""


def umask() -> int:
    """This process's umask, read without changing it (setting it for a moment races with threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # no procfs (macOS, old kernels): the only way there is
    os.umask(old)
    return old


def read_mode() -> int:
    """Files people read (metrics, records, reports): the user's umask decides."""
    return 0o666 & ~umask()


def exec_file_mode() -> int:
    """Files a job executes or unpickles: never writable by group or others, whatever the umask."""
    return 0o644 & ~umask()


def exec_dir_mode() -> int:
    return 0o755 & ~umask()


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _open_checked(path: str, flags: int, mode: int, allowed_uids: Callable[[], Tuple[int, ...]],
                  what: str) -> int:
    """``os.open`` without following a link, then ``fstat``: a regular file owned by one of
    ``allowed_uids()``; :class:`UnsafeFile` saying why otherwise (``what`` ends each reason)."""
    try:
        fd = os.open(path, flags | NOFOLLOW, mode)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(exc.errno, f"{path} is a symbolic link: not followed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file: {what}")
        if st.st_uid != os.geteuid() and st.st_uid not in allowed_uids():  # asked only then: a stat, for a reader
            raise UnsafeFile(f"{path} belongs to {owner_name(st.st_uid)}, not to you: {what}")
        if flags & os.O_RDWR and st.st_nlink != 1:  # a hard link to a file of ours would be written through
            raise UnsafeFile(f"{path} has {st.st_nlink} names (a hard link): {what}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_lock(path: PathLike, mode: Optional[int] = None) -> int:
    """A lock file's descriptor (``O_RDWR``, created if missing): never through a link, only a regular file
    of ours with one name."""
    return _open_checked(os.fspath(path), os.O_RDWR | os.O_CREAT, read_mode() if mode is None else mode,
                         lambda: (os.geteuid(),), "not used as a lock")


def own_dir(path: PathLike, mode: Optional[int] = None) -> Path:
    """``path`` as a directory of ours (made with ``mode``, default :func:`exec_dir_mode`, parents as
    ``mkdir -p`` with the umask); an existing one that is a link or another user's is refused."""
    path = Path(path)
    mode = exec_dir_mode() if mode is None else mode
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, mode)
        made = True
    except FileExistsError:
        made = False
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(f"{path} is not a directory (a link or a file is in its place)")
    if st.st_uid != os.geteuid():
        raise UnsafeFile(f"{path} belongs to {owner_name(st.st_uid)}, not to you")
    if made or st.st_mode & 0o022 & ~mode:  # mkdir's mode passed through the umask: the explicit one wanted
        os.chmod(path, mode | (st.st_mode & stat.S_ISGID))  # a setgid project dir's group kept
    return path


def tree_problems(sweep_dir: PathLike, launch_dir: PathLike) -> List[str]:
    """Why jobs must not run from ``sweep_dir``: it, or an existing parent of it under ``launch_dir``, is a
    link made by another user, belongs to another user (root aside), or is writable by every user without
    the sticky bit: whoever can rename a directory there can put their own code in its place."""
    sweep, top = Path(os.path.abspath(sweep_dir)), Path(os.path.abspath(launch_dir))
    chain = [sweep] + [p for p in sweep.parents if top in p.parents]
    me, problems = os.geteuid(), []
    for d in chain:
        try:
            lst = os.lstat(d)
            st = os.stat(d)
        except FileNotFoundError:
            continue  # made by hpctrain, as the user
        except OSError as exc:
            problems.append(f"{d}: cannot be checked ({exc.strerror})")
            continue
        if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (me, 0):
            problems.append(f"{d} is a link made by {owner_name(lst.st_uid)}, not by you: jobs would run code "
                            f"they could replace; choose another hydra.sweep.dir")
        elif st.st_uid not in (me, 0):
            problems.append(f"{d} belongs to {owner_name(st.st_uid)}, not to you: jobs would run code they "
                            f"could replace; choose another hydra.sweep.dir")
        elif st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
            problems.append(f"{d} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit): "
                            f"chmod o-w it or choose another hydra.sweep.dir")
    return problems


def open_read(path: PathLike) -> int:
    """A read-only descriptor of a file hpctrain reads in a sweep dir (a log, a record): not a link (one
    planted there would copy a file of the reader's into a report others read), a regular file, owned by the
    reader or by the owner of the directory holding it; :class:`UnsafeFile` saying why otherwise."""
    path = os.fspath(path)
    return _open_checked(path, os.O_RDONLY | os.O_NONBLOCK, 0,
                         lambda: (os.geteuid(), os.stat(os.path.dirname(path) or ".").st_uid), "not read")


def guard_tree(sweep_dir: PathLike, launch_dir: PathLike) -> List[str]:
    """Set the sticky bit on the user's own group- or world-writable directories from ``sweep_dir`` up to
    ``launch_dir`` (as :func:`tree_problems` walks them): others may still make their own entries there, not
    rename or remove the user's (a swapped sweep dir). The notes to print, one per directory changed."""
    sweep, top = Path(os.path.abspath(sweep_dir)), Path(os.path.abspath(launch_dir))
    chain = [sweep] + ([p for p in sweep.parents if top in p.parents] if top in sweep.parents else [])
    notes = []
    for d in chain:
        try:
            st = os.lstat(d)
            if (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o022
                    and not st.st_mode & stat.S_ISVTX):
                os.chmod(d, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)
                notes.append(f"{d}: sticky bit set (it is writable by others: they could rename the sweep dir away)")
        except OSError:
            continue
    return notes
