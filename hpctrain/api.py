"""The Python face over sweeps: ``hpctrain.load(dir)``, ``hpctrain.launch([...])``, ``hpctrain.compare([...])``.

A thin public face: the sweep, its runs and their reading are review's own (:mod:`hpctrain.review.reader`,
the one reader ``status``, ``report`` and the tab use too). Login side: no torch; whatever cannot be read
is said in ``Sweep.problems``, never raised.

    import hpctrain
    sweep = hpctrain.load("multirun/2026-12-01/10-00-00")
    sweep.best(), sweep.to_pandas(), sweep.curves("val/loss"), sweep.gpu_hours()
"""

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from hpctrain.core.paths import SweepPaths
from hpctrain.review.reader import Curve, PathLike, Sweep, load, read
from hpctrain.review.runs import Run
from hpctrain.review.sweep import SweepError

__all__ = ["Curve", "Run", "Sweep", "SweepError", "compare", "launch", "load", "read"]


def compare(paths: Sequence[PathLike]) -> Any:
    """One table (pandas) of the runs of several sweeps, a ``sweep`` column first."""
    frames = []
    for path in paths:
        frame = load(path).to_pandas()
        frame.insert(0, "sweep", str(path))
        frames.append(frame)
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def launch(overrides: Sequence[str], launcher: Optional[str] = None, sweep_dir: Optional[PathLike] = None,
           app: Sequence[str] = ("-m", "hpctrain"), cwd: Optional[PathLike] = None) -> Sweep:
    """Submit a sweep as ``python -m hpctrain -m OVERRIDES`` would, and return it without waiting (``.wait()``).

    ``launcher``: "slurm", "local", or None (Slurm when sbatch is on PATH). On Slurm the call returns once the
    sweep is queued; the local launcher runs in a child process the returned Sweep holds. Bad input raises
    ``SweepError`` with the launcher's message as one line; nothing is submitted then, and a sweep dir
    the call made is removed (and its date dir, when empty).
    """
    where = Path(cwd or os.getcwd())
    target = Path(sweep_dir) if sweep_dir else Path("multirun", time.strftime("%Y-%m-%d"), time.strftime("%H-%M-%S"))
    target = target if target.is_absolute() else where / target
    existed = target.exists()
    try:
        return _launch(overrides, launcher, target, app, where)
    except SweepError:
        if not existed and not SweepPaths(target).manifest.exists():
            _remove_new(target, where)  # a refused sweep leaves no dir: defaults keep pointing at the last real one
        raise


def _remove_new(target: Path, where: Path) -> None:
    """Remove the refused sweep's dir and the date dir above it when they hold nothing else."""
    shutil.rmtree(target, ignore_errors=True)
    for parent in target.parents:
        if parent == where or not parent.is_relative_to(where):
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def _launch(overrides: Sequence[str], launcher: Optional[str], target: Path, app: Sequence[str],
            where: Path) -> Sweep:
    argv = [sys.executable, *app, "-m", *overrides, f"hydra.sweep.dir={target}"]
    if launcher:
        argv.append(f"hydra/launcher={launcher}")
    if launcher == "local" or (launcher is None and not _has_sbatch()):
        log_path = SweepPaths(target).launch_log  # the launcher's own output
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, cwd=where, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not SweepPaths(target).manifest.exists():  # planned and checked: the manifest is written first
            if proc.poll() is not None:
                raise SweepError(_first_error(log_path.read_text(), argv))
            if time.monotonic() > deadline:
                proc.terminate()  # its dir is removed: nothing may go on writing there
                proc.wait()
                raise SweepError(f"{target}: no sweep.json within 120 s of `{shlex.join(argv)}`")
            time.sleep(0.2)
        sweep = load(target)
        sweep.process = proc
        return sweep
    done = subprocess.run(argv, cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        raise SweepError(_first_error(done.stderr, argv))
    return load(target)


def _has_sbatch() -> bool:
    return shutil.which("sbatch") is not None


# Hydra's advice and context lines around its error: the exception says the error alone
_NOT_THE_ERROR = ("hpctrain: launcher ", "To append to your config", "Set the environment variable HYDRA_FULL_ERROR",
                  "full_key:", "object_type=", "reference_type=", "Traceback (most recent call last)")


def _first_error(text: str, argv: Sequence[str]) -> str:
    """The launcher's error as one line (Hydra's several lines and an hpctrain problem list joined)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(_NOT_THE_ERROR)]
    if not lines:
        return f"`{shlex.join(argv)}` failed"
    joined = lines[0]
    for line in lines[1:8]:
        joined = f"{joined} {line}" if joined.endswith(":") else f"{joined.rstrip('.')}: {line}"
    return joined if len(joined) <= 400 else joined[:399] + "…"
