"""The code a submission runs: one copy, taken at submit time, into the sweep dir.

A sweep can wait in the queue for hours; without a copy every task imports the project from the working
tree as it is when the task starts, so an edit made after submitting changes queued runs, and a requeued
run can resume with other code than it started with. The copy holds the git work tree the sweep is
launched from (tracked files and untracked ones git does not ignore), the hpctrain checkout when hpctrain
is not installed into site-packages (``pip install -e``), and ``hydra.launcher.snapshot.paths``. Paths
keep their absolute place under the copy (``code/home/me/proj/...``), so every ``sys.path`` entry of the
launching process that lies in a copied tree maps to its copy; the job gets those first on PYTHONPATH,
and ``PYTHONSAFEPATH=1`` keeps the job's working directory (the live tree) off ``sys.path``.

Login-node code: no torch.
"""

import fnmatch
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hpctrain.core.paths import HPCTRAIN_DIR, HYDRA_DIR, MULTIRUN_YAML, SUBMITIT_DIR

KEYS = ("enabled", "paths", "max_mb")
SKIP_NAMES = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ipynb_checkpoints"}
OUTPUT_MARKERS = {HYDRA_DIR, SUBMITIT_DIR, HPCTRAIN_DIR}  # a directory holding one is a run's or sweep's output
MB = 1024 * 1024
BIGGEST = 5  # files named when the size cap is exceeded
# secret files by name: left out of the copy (a copy lands in the sweep dir, read by the group); one named
# itself in hydra.launcher.snapshot.paths is copied all the same
SECRET_NAMES = (".env", ".env.*", "*.env", ".netrc", "_netrc", ".pgpass", ".git-credentials", ".pypirc", ".npmrc",
                ".htpasswd", "credentials", "credentials.json", "credentials.yaml", "credentials.yml",
                "secrets.yaml", "secrets.yml", "secrets.json", "secrets.toml", "client_secret*.json",
                "service-account*.json", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_*_key", "*.pem",
                "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx", "*.gpg", "*.asc")
SECRET_PATHS = (".aws/credentials", ".aws/config", ".ssh/*", ".kube/config", ".docker/config.json",
                ".config/gcloud/*", ".gnupg/*")
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".json", ".cfg", ".ini")  # an app's code outside git


@dataclass
class SnapshotOptions:
    """``hydra.launcher.snapshot`` as the user set it: ``false``, or these keys."""

    enabled: bool = True
    paths: List[str] = field(default_factory=list)  # more files or directories to copy
    max_mb: float = 50.0  # the copy's size cap


def read_options(value: Any) -> Tuple[Optional[SnapshotOptions], List[str]]:
    """The options, None when turned off, and the problems (one line each) with the value."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None or value is False:
        return None, []
    if value is True:
        return SnapshotOptions(), []
    if not isinstance(value, dict):
        return None, [f"hydra.launcher.snapshot={value!r}: expected false or a mapping with {', '.join(KEYS)}"]
    problems = [f"hydra.launcher.snapshot.{k}: unknown key (valid: {', '.join(KEYS)})" for k in value if k not in KEYS]
    s = SnapshotOptions()
    enabled, paths, max_mb = value.get("enabled", s.enabled), value.get("paths") or [], value.get("max_mb", s.max_mb)
    if not isinstance(enabled, bool):
        problems.append(f"hydra.launcher.snapshot.enabled={enabled!r}: expected true or false")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        problems.append(f"hydra.launcher.snapshot.paths={paths!r}: expected a list of paths")
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or max_mb <= 0:
        problems.append(f"hydra.launcher.snapshot.max_mb={max_mb!r}: expected a number > 0")
    if problems or not enabled:
        return None, problems
    return SnapshotOptions(True, list(paths), float(max_mb)), []


# ---------------------------------------------------------------- where the code comes from
GIT_TIMEOUT_S = 60


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    """A git call; one that hangs (a stale NFS mount, a credential prompt) answers exit 124 and says so."""
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"`git {' '.join(args)}` in {root} gave no answer "
                                                          f"within {GIT_TIMEOUT_S} s")


def git_toplevel(path: Path) -> Tuple[Optional[Path], str]:
    """The work tree holding ``path``, or None and why not (git missing, not a repository, ...)."""
    try:
        proc = git(path, "rev-parse", "--show-toplevel")
    except OSError as exc:
        return None, f"git could not be run ({exc})"
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [""])[0]
        return None, "" if "not a git repository" in first else first
    return Path(proc.stdout.strip()), ""


def hpctrain_checkout() -> Optional[Path]:
    """The directory holding the hpctrain package when it is a checkout (editable install, or a source
    tree on sys.path), not a copy installed into site-packages (there, edits do not happen)."""
    import hpctrain

    package_dir = Path(hpctrain.__file__).resolve().parent
    try:
        direct = json.loads(importlib.metadata.distribution("hpctrain").read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        direct = {}
    if direct.get("dir_info", {}).get("editable"):
        return package_dir.parent
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    return None if any(p in package_dir.parents for p in installed) else package_dir.parent


class GitError(Exception):
    """git could not list a work tree's files."""


def _git_files(root: Path, prefix: str = "") -> List[str]:
    """Tracked and untracked-not-ignored files of a work tree, relative to it; submodules recursed."""
    proc = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if proc.returncode != 0:
        raise GitError((proc.stderr.strip().splitlines() or [f"git ls-files: exit code {proc.returncode}"])[0])
    names = []
    for name in dict.fromkeys(n for n in proc.stdout.split("\0") if n):
        path = root / name
        if path.is_dir() and not path.is_symlink():  # a submodule: its own work tree
            if (path / ".git").exists():
                names += _git_files(path, f"{prefix}{name}/")
            continue
        names.append(prefix + name)
    return names


def _walk_files(root: Path) -> List[str]:
    """Every file under a listed directory, relative to it (symlinks to directories are not followed)."""
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        envs = [d for d in dirnames if os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
                or os.path.isdir(os.path.join(dirpath, d, "conda-meta"))]
        names += [f"{d}/pyvenv.cfg" if rel == "." else f"{rel}/{d}/pyvenv.cfg" for d in envs]  # _keep says so
        dirnames[:] = [d for d in dirnames if d not in SKIP_NAMES and d not in envs]  # not walked: thousands of files
        names += [n if rel == "." else f"{rel}/{n}" for n in filenames]
        names += [d if rel == "." else f"{rel}/{d}" for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
    return names


def _keep(names: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The names to copy, and the directories left out: virtual environments, Hydra/hpctrain outputs."""
    dropped: Set[str] = set()
    for name in names:
        parts = name.split("/")
        if parts[-1] in ("pyvenv.cfg", MULTIRUN_YAML):
            dropped.add("/".join(parts[:-1]) or ".")
        elif len(parts) > 1 and parts[-2] == "conda-meta":
            dropped.add("/".join(parts[:-2]) or ".")
        for i, part in enumerate(parts[:-1]):
            if part in OUTPUT_MARKERS:
                dropped.add("/".join(parts[:i]) or ".")
                break
    kept = []
    for name in names:
        parts = name.split("/")
        if parts[-1].endswith(".pyc") or any(p in SKIP_NAMES for p in parts):
            continue
        if "." in dropped or any("/".join(parts[:i]) in dropped for i in range(1, len(parts))):
            continue
        kept.append(name)
    return kept, sorted(dropped)


def is_secret(name: str) -> bool:
    """Whether a file (a path relative to its tree) has the name of a well-known secret file."""
    base = name.rsplit("/", 1)[-1]
    if any(fnmatch.fnmatchcase(base, pattern) for pattern in SECRET_NAMES):
        return True
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*/" + p) for p in SECRET_PATHS)


def kept_names(root: Path, names: Sequence[str], exclude: Sequence[Path] = ()) -> List[str]:
    """``names`` (relative to ``root``) as a snapshot takes them: outside ``exclude`` and the directories
    :func:`_keep` leaves out."""
    prefixes = tuple(os.path.relpath(Path(e).resolve(), root) + "/" for e in exclude)
    return [n for n in _keep(names)[0] if not n.startswith(prefixes)]


# ---------------------------------------------------------------- the plan, and the copy
@dataclass
class CodeCopy:
    """The snapshot planned: what is copied where; ``take()`` copies. Built on the login node before anything is submitted."""

    code_dir: Path = Path()  # <sweep>/.hpctrain/submission-N/code
    files: Dict[str, int] = field(default_factory=dict)  # absolute source path -> size in bytes
    repos: List[Path] = field(default_factory=list)  # the git work trees among them
    app_dir: Optional[Path] = None  # the app's own directory where it is in no git work tree
    notes: List[str] = field(default_factory=list)  # said when the snapshot is taken
    secrets: List[str] = field(default_factory=list)  # files left out by name (SECRET_NAMES)
    problems: List[str] = field(default_factory=list)
    taken: bool = False

    def copy_of(self, path: "str | Path") -> Path:
        return self.code_dir / str(Path(path)).lstrip("/")

    def python_path(self, cwd: Path) -> List[str]:
        """The job's first PYTHONPATH entries: the copies of this process's sys.path entries that lie in a
        copied tree (the launch dir first, as Python puts it first; kept as is when it was not copied)."""
        dirs = {os.path.dirname(f) for f in self.files}
        have = set()
        for d in dirs:
            while d not in have and d != "/":
                have.add(d)
                d = os.path.dirname(d)
        out = [str(self.copy_of(cwd)) if str(cwd) in have else str(cwd)]
        for entry in sys.path:
            entry = os.path.realpath(entry or cwd)
            if entry in have and str(self.copy_of(entry)) not in out:
                out.append(str(self.copy_of(entry)))
        return out

    def take(self) -> float:
        """Copy the files (into a temporary folder, renamed when complete); the seconds it took."""
        if self.taken:
            return 0.0
        from hpctrain.core import safefs

        start = time.perf_counter()
        safefs.own_dir(self.code_dir.parent)  # submission-N: no one else may rename code/ away
        tmp = self.code_dir.with_name(f"{self.code_dir.name}.tmp-{os.getpid()}")
        made: Set[str] = set()
        vanished: List[str] = []
        try:
            for src in self.files:
                dst = os.path.join(tmp, src.lstrip("/"))
                parent = os.path.dirname(dst)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                try:
                    if os.path.islink(src):
                        os.symlink(os.readlink(src), dst)
                    else:
                        shutil.copy2(src, dst)  # a copy, not a hard link: an edit in place must not reach it
                except FileNotFoundError:  # gone since it was listed: an editor's swap file, .nfsXXXX, a log
                    vanished.append(src)
            tmp.mkdir(parents=True, exist_ok=True)
            _no_write_for_others(tmp)
            tmp.replace(self.code_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for src in vanished:
            del self.files[src]
        if vanished:
            self.notes.append(f"{len(vanished)} file(s) vanished between listing and copying, left out: "
                              + ", ".join(vanished[:5]) + (" ..." if len(vanished) > 5 else ""))
        self.taken = True
        return time.perf_counter() - start


def _no_write_for_others(top: "str | Path") -> None:
    """The copy's modes, whatever the umask and the sources' modes: what a job imports is never writable
    by group or others (a colleague's edit would run as the user)."""
    from hpctrain.core import safefs

    dir_mode = safefs.exec_dir_mode()
    os.chmod(top, dir_mode)
    for dirpath, dirnames, filenames in os.walk(top):
        for d in dirnames:
            path = os.path.join(dirpath, d)
            if not os.path.islink(path):
                os.chmod(path, dir_mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not os.path.islink(path) and st.st_mode & 0o022:
                os.chmod(path, st.st_mode & 0o7755)


def app_dir(task_function: Any) -> Optional[Path]:
    """The directory of the app's task function (``python ~/proj/train.py``), where it is the user's own
    code: not hpctrain's app, not a package installed into site-packages or the standard library."""
    import inspect

    import hpctrain

    try:
        task_file = inspect.getsourcefile(inspect.unwrap(task_function))
    except (TypeError, OSError):
        return None
    if not task_file:
        return None

    path = Path(os.path.realpath(task_file))
    installed = [Path(hpctrain.__file__).resolve().parent]
    installed += [Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib", "stdlib")]
    if not path.is_file() or any(p == path.parent or p in path.parents for p in installed):
        return None
    return path.parent


def code_sources(cwd: Path, app: Optional[Path] = None) -> Tuple[List[Tuple[Path, bool]], str]:
    """(directory, is a git work tree) for the app's own work tree (or its directory), the launch dir's work
    tree and the hpctrain checkout, and why the launch dir is in no work tree ("" when it is)."""
    sources: List[Tuple[Path, bool]] = []
    if app is not None:  # first: the app's commit is the one a report names first
        app_top = git_toplevel(app)[0]
        sources.append((app_top, True) if app_top else (app, False))
    top, why = git_toplevel(cwd)
    note = "" if top else f"{cwd} is not in a git work tree{' (' + why + ')' if why else ''}"
    if top:
        sources.append((top, True))
    checkout = hpctrain_checkout()
    if checkout is not None:
        checkout_top = git_toplevel(checkout)[0]
        sources.append((checkout_top or checkout, checkout_top is not None))
    seen: Set[Path] = set()
    unique = []
    for root, is_git in sources:
        if root.resolve() not in seen:
            seen.add(root.resolve())
            unique.append((root, is_git))
    return unique, note


def source_repos(cwd: Path, app: Optional[Path] = None) -> List[Path]:
    """The git work trees a snapshot would come from (for the record when there is no snapshot)."""
    return list(dict.fromkeys(root.resolve() for root, is_git in code_sources(cwd, app)[0] if is_git))


def plan(options: SnapshotOptions, cwd: Path, code_dir: Path, exclude: Sequence[Path] = (),
         app: Optional[Path] = None) -> CodeCopy:
    """Which files the snapshot would hold, the notes to print and the problems (size cap, bad paths).
    ``app``: the directory of the app's own task function (:func:`app_dir`)."""
    snap = CodeCopy(code_dir=code_dir)
    sources, note = code_sources(cwd, app)
    plain_app = app is not None and (app, False) in sources  # the app's directory, in no git work tree
    if plain_app:
        snap.app_dir = app
        snap.notes.append(f"the app's directory {app} is not in a git work tree: the code snapshot holds its "
                          f"source and config files ({', '.join(SOURCE_SUFFIXES)}; no commit to record)")
    if note and app is None:
        snap.notes.append(f"{note}: the code snapshot holds only hydra.launcher.snapshot.paths and an "
                          f"editable hpctrain checkout")
    for i, raw in enumerate(options.paths):
        path = (cwd / os.path.expanduser(raw)).resolve()
        if not os.path.lexists(path):
            snap.problems.append(f"hydra.launcher.snapshot.paths[{i}]={raw!r}: no such file or directory")
        else:
            sources.append((path, False))
    excluded = [str(Path(p).resolve()) + os.sep for p in exclude]
    dropped_all: List[str] = []
    secrets_left: List[str] = []
    for root, is_git in sources:
        root = root.resolve()
        dropped: List[str] = []
        if root.is_file() or root.is_symlink():
            names = [root.name]
            root = root.parent
        else:
            try:
                names, dropped = _keep(_git_files(root) if is_git else _walk_files(root))
                if plain_app and root == app:  # a directory of anything (a home dir): its code, not its data
                    names = [n for n in names if n.endswith(SOURCE_SUFFIXES)]
            except GitError as exc:
                snap.problems.append(f"code snapshot of {root}: {exc}")
                continue
            if is_git and root not in snap.repos:
                snap.repos.append(root)
            secrets_left += [os.path.join(root, n) for n in names if is_secret(n)]
            names = [n for n in names if not is_secret(n)]
        # this launch's own sweep dir, which Hydra has just made, is no advice to anyone
        dropped_all += [str(root / d) for d in dropped if not any((str(root / d) + os.sep).startswith(e) for e in excluded)]
        for name in names:
            src = os.path.join(root, name)
            if src in snap.files or any(src.startswith(e) for e in excluded):
                continue
            try:
                snap.files[src] = os.lstat(src).st_size
            except OSError:
                continue  # tracked, but deleted in the work tree
    if dropped_all:
        snap.notes.append("left out of the code snapshot (virtual environments, run outputs; add them to "
                          ".gitignore): " + ", ".join(sorted(set(dropped_all))[:5])
                          + (" ..." if len(set(dropped_all)) > 5 else ""))
    secrets_left = sorted(set(secrets_left) - set(snap.files))
    if secrets_left:
        snap.secrets = secrets_left
        snap.notes.append(f"left out of the code snapshot: {len(secrets_left)} file(s) named like secrets ("
                          + ", ".join(secrets_left[:5]) + (" ..." if len(secrets_left) > 5 else "")
                          + "); name one in hydra.launcher.snapshot.paths to copy it all the same")
    total = sum(snap.files.values())
    if total > options.max_mb * MB:
        snap.problems.append(f"hydra.launcher.snapshot.max_mb={options.max_mb:g}: the code snapshot would hold "
                             f"{_size(total)} in {len(snap.files)} files; git-ignore large files, or raise "
                             f"the cap; the biggest:")
        for src, size in sorted(snap.files.items(), key=lambda kv: -kv[1])[:BIGGEST]:
            snap.problems.append(f"hydra.launcher.snapshot: {src} ({_size(size)})")
    if sys.version_info < (3, 11):
        snap.notes.append("Python < 3.11 ignores PYTHONSAFEPATH: modules in the launch directory itself are "
                          "imported from the live tree, ahead of the snapshot")
    return snap


def _size(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB / 10 else f"{n / 1024:.0f} kB"


def setup_lines(python_path: Sequence[str], container_runtime: Optional[str]) -> List[str]:
    """Shell lines for the job script: the snapshot first on PYTHONPATH, the live launch dir off sys.path;
    passed into the container too (``APPTAINERENV_*`` survives ``--cleanenv``)."""
    import shlex

    lines = [f"export PYTHONPATH={shlex.quote(os.pathsep.join(python_path))}\"${{PYTHONPATH:+:$PYTHONPATH}}\"",
             "export PYTHONSAFEPATH=1"]
    if container_runtime:
        prefix = f"{container_runtime.upper()}ENV_"
        lines += [f'export {prefix}PYTHONPATH="$PYTHONPATH"', f"export {prefix}PYTHONSAFEPATH=1"]
    return lines


def relocate_search_path(hydra_context: Any, snap: CodeCopy) -> Any:
    """A copy of Hydra's context whose config directories inside the snapshot are read from the copy, so
    that the job composes its config from the YAML files as they were at submit time."""
    import copy

    from hydra.types import HydraContext

    from hpctrain._compat.hydra import config_loader, search_path_of

    loader = hydra_context.config_loader
    search_path = search_path_of(loader)
    if search_path is None:
        return hydra_context
    search_path = copy.deepcopy(search_path)
    changed = False
    for element in search_path.get_path():
        path = element.path or ""
        if path.startswith("file://") or (path and "://" not in path):
            local = os.path.realpath(path[len("file://"):] if path.startswith("file://") else path)
            if local in snap.files or os.path.isdir(snap.copy_of(local)):
                element.path = f"file://{snap.copy_of(local)}"
                changed = True
    if not changed:
        return hydra_context
    return HydraContext(config_loader=config_loader(search_path),
                        callbacks=hydra_context.callbacks)
