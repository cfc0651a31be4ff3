"""The login-node side stays light: no torch on the way to submitting, and the console script."""

import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import hpctrain_env

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra


def _imported_modules(stderr: str) -> set:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_submitting_a_sweep_never_imports_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpctrain", "-m", "lr=1e-3,1e-4",
                           "hydra/launcher=slurm", "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"],
                          cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = _imported_modules(proc.stderr)
    assert "hydra" in modules and "submitit" in modules  # the measurement saw the imports
    assert not {m for m in modules if m == "torch" or m.startswith("torch.")}


def test_console_script_is_python_dash_m(tmp_path):
    script = Path(sys.executable).parent / "hpctrain"
    args = ["status", str(tmp_path / "nowhere")]
    a = subprocess.run([str(script), *args], capture_output=True, text=True, env=hpctrain_env(), cwd=tmp_path)
    b = subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True,
                       env=hpctrain_env(), cwd=tmp_path)
    assert a.returncode == b.returncode != 0
    assert a.stderr == b.stderr and "nowhere" in a.stderr


def test_launcher_never_imports_review():
    """The launcher sits on cluster.py and record.py, below review/, not on review/ itself."""
    code = ("import sys, hpctrain.submit.backends.slurm, hpctrain.submit.backends.local, "
            "hpctrain.job.wrapper, hpctrain.job.attempt_ended, "
            "hpctrain.submit.sweeper; "
            "print(sorted(m for m in sys.modules if m.startswith('hpctrain.review') or m == 'torch'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=hpctrain_env(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
