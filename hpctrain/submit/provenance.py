"""What ran, recorded once per submission: ``<sweep>/.hpctrain/submission-N/record.json``.

The git commit and diff of each repository the code came from, the Python version, the launching
environment's distributions (read in-process: a ``pip`` subprocess would cost seconds) or the container
image, hpctrain's version, the full command line, the environment the job got, and the Slurm job ids.
``report`` reads it back to say which code the best run ran and how to run that code again.

Login-node code: no torch.
"""

import importlib.metadata
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpctrain.core import events
from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import SweepPaths
from hpctrain.core.redact import redact_argv, redact_env
from hpctrain.submit.snapshot import git, kept_names

RECORD = "record.json"
MAX_UNTRACKED = 200  # untracked files named in the record (all are counted)


def _repo_state(root: Path, folder: Path, n: int, exclude: Sequence[Path]) -> Dict[str, Any]:
    """Commit, branch, ``git diff HEAD`` (into its own file) and the untracked files of one work tree
    (as the snapshot takes them: no sweep dirs, no virtual environments)."""
    head = git(root, "rev-parse", "--verify", "-q", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else None
    branch = git(root, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() if commit else None
    diff = git(root, "diff", "--no-color", "--no-ext-diff", "HEAD").stdout if commit else ""
    listed = git(root, "ls-files", "-z", "--others", "--exclude-standard").stdout.split("\0")
    untracked = kept_names(root, [n for n in listed if n], exclude)
    sizes = []
    for name in untracked[:MAX_UNTRACKED]:
        try:
            sizes.append({"path": name, "bytes": os.lstat(root / name).st_size})
        except OSError:
            continue
    diff_file = None
    if diff:
        diff_file = f"git-{n}.diff"
        (folder / diff_file).write_text(diff)
    return {"root": str(root), "commit": commit, "branch": branch, "dirty": bool(diff or untracked or not commit),
            "diff_file": diff_file, "diff_lines": diff.count("\n"), "untracked_count": len(untracked),
            "untracked": sizes}


def _distributions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for dist in importlib.metadata.distributions():
        name, version = _name_version(dist)
        if name:
            out[name] = version
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def _name_version(dist: importlib.metadata.Distribution) -> Tuple[Optional[str], Optional[str]]:
    """A distribution's ``Name`` and ``Version`` from its metadata's headers, read as plain lines up to the
    first blank one (``dist.metadata`` parses the whole file as e-mail, twice with ``dist.version``: ~4,000
    calls a distribution); the e-mail parser where a header is folded or missing."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: Dict[str, str] = {}
    for line in text.split("\n", 200)[:200]:
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if line[:1] in " \t" or not sep:  # a folded header: the e-mail parser reads it
            return dist.metadata["Name"], dist.metadata["Version"]
        if key in ("Name", "Version") and key not in found:
            found[key] = value.strip()
    if len(found) < 2:
        meta = dist.metadata
        return meta["Name"], meta["Version"]
    return found["Name"], found["Version"]


def _image(path: str) -> Dict[str, Any]:
    st = os.stat(path)
    return {"path": str(Path(path).absolute()), "bytes": st.st_size, "mtime": st.st_mtime,
            "mtime_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(st.st_mtime))}


def write(folder: Path, sweep_dir: Path, *, runs: Sequence[int], repos: Sequence[Path], code_dir: Optional[Path],
          python_path: Optional[List[str]], job_python: str, image: Optional[str],
          app_dir: Optional[Path] = None) -> Path:
    """The record, before the jobs exist (their ids are added by :func:`add_job_ids`)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        version = importlib.metadata.version("hpctrain")
    except importlib.metadata.PackageNotFoundError:
        version = None
    record = {
        "time": time.time(),
        "argv": redact_argv(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "python": sys.executable,
        "python_version": platform.python_version(),
        "hpctrain_version": version,
        "repositories": [_repo_state(root, folder, n, [sweep_dir]) for n, root in enumerate(repos)],
        # the app's own directory where no git work tree holds it (its commit is then unknown)
        "app_dir": str(app_dir) if app_dir is not None and not any(Path(r) in (app_dir, *app_dir.parents)
                                                                     for r in repos) else None,
        "snapshot": str(code_dir) if code_dir else None,
        "job_env": redact_env({"PYTHONPATH": os.pathsep.join(python_path), "PYTHONSAFEPATH": "1"}
                              if python_path else {}),
        "job_python": job_python,  # the interpreter, or the container command ending in it
        "container_image": _image(image) if image else None,
        # inside a container the image's packages run, not this environment's
        "distributions": None if image else _distributions(),
        "runs": list(runs),
        "job_ids": [],
    }
    path = folder / RECORD
    write_json_atomic(path, record)
    return path


def add_job_ids(path: Path, job_ids: Sequence[str]) -> None:
    record = read_json(path)
    if record is not None:
        record["job_ids"] = sorted(set(record.get("job_ids", [])) | {str(j).split("_")[0] for j in job_ids})
        write_json_atomic(path, record)


def for_run(sweep_dir: Path, idx: int, run_dir: Optional[Path] = None) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
    """The newest submission's record that holds run ``idx`` (a rerun of a sweep is a new submission).

    A search's submissions list no runs (their workers take trials as they come): a trial (``run_dir``)
    was run by the newest of them recorded before the trial's first event."""
    found = []
    sweep_paths = SweepPaths(sweep_dir)
    for number in sweep_paths.submission_numbers():
        path = sweep_paths.submission(number) / RECORD
        if path.is_file():
            found.append((number, path))
    records = [(path, read_json(path)) for _, path in sorted(found, reverse=True)]
    for path, record in records:
        if record and idx in record.get("runs", []):
            return path, record
    first = next(iter(events.events(run_dir)), None) if run_dir else None
    searches = [(path, record) for path, record in records if record and not record.get("runs")]
    if first is None or not searches:
        return None, None
    before = [(p, r) for p, r in searches if r.get("time", 0) <= first.time_ns / 1e9]
    return before[0] if before else searches[-1]  # none before it: a compute node's clock behind, the first one


def code_lines(path: Path, record: Dict[str, Any]) -> List[str]:
    """One line per repository: its commit, and "with local changes" when it had any."""
    lines = [f"{record['app_dir']} (the app's directory; no git work tree, so no commit)"] if record.get("app_dir") else []
    for repo in record.get("repositories", []):
        commit = repo["commit"][:12] if repo.get("commit") else "(no commit yet)"
        changes = ""
        if repo.get("dirty"):
            where = [str(path.parent / repo["diff_file"])] if repo.get("diff_file") else []
            if repo.get("untracked_count"):
                where.append(f"{repo['untracked_count']} untracked file(s)")
            changes = f" with local changes ({', '.join(where)})" if where else " with local changes"
        lines.append(f"{repo.get('root')} at commit {commit}{changes}")
    if record.get("snapshot"):
        lines.append(f"snapshot of that code: {record['snapshot']}")
    return lines


def reproduce_command(command: str, record: Dict[str, Any]) -> str:
    """``command`` (``[cd DIR && ]python -m APP OVERRIDES``) run with the submission's interpreter and its
    code snapshot first on PYTHONPATH."""
    head, sep, tail = command.partition("python -m ")
    if not sep:
        return command
    env = record.get("job_env") or {}
    if env.get("PYTHONPATH"):
        prefix = (f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])}\"${{PYTHONPATH:+:$PYTHONPATH}}\" "
                  f"PYTHONSAFEPATH=1 ")
    else:
        prefix = ""
    if record.get("container_image") and prefix:
        runtime = (record.get("job_python") or "apptainer").split()[0].upper()
        prefix += f"{runtime}ENV_PYTHONPATH={shlex.quote(env['PYTHONPATH'])} {runtime}ENV_PYTHONSAFEPATH=1 "
    python = record.get("job_python") or "python"
    module, _, overrides = tail.partition(" ")
    script = _script(record)
    if module == "__main__" and script:  # an app run as `python app.py`: its copy in the snapshot
        copy = Path(record["snapshot"], script.lstrip("/")) if record.get("snapshot") else Path(script)
        return f"{head}{prefix}{python} {shlex.quote(str(copy if copy.exists() else script))} {overrides}".rstrip()
    return f"{head}{prefix}{python} -m {tail}"


def _script(record: Dict[str, Any]) -> Optional[str]:
    """The script of ``python [OPTIONS] SCRIPT ...`` (absolute), None for ``python -m MODULE``."""
    for arg in (record.get("argv") or [])[1:]:
        if arg == "-m":
            return None
        if not arg.startswith("-"):
            return os.path.realpath(os.path.join(record.get("cwd") or "", arg))
    return None


def for_report(sweep_dir: Path, idx: int, command: str, run_dir: Optional[Path] = None) -> Tuple[str, List[str]]:
    """The reproduce command of run ``idx`` (a search's trial: its ``run_dir``) made to rerun its
    submission's code, and the lines that say which code that was; unchanged (and no lines) for a sweep
    submitted without a record."""
    path, record = for_run(sweep_dir, idx, run_dir)
    if path is None or record is None:
        return command, []
    return reproduce_command(command, record), code_lines(path, record)
