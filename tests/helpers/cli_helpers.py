"""Run hpctrain as a user does (a subprocess) and read what it wrote: shared by the tests."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"


def hpctrain_env(extra: Optional[dict] = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # tables as piped, unless a test says
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), env.get("PYTHONPATH")]))
    env.setdefault("HYDRA_FULL_ERROR", "0")
    env.update(extra or {})
    return env


def run_hpctrain(args: List[str], cwd: Path, env: Optional[dict] = None, timeout: float = 600,
                 check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpctrain {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def status_runs(sweep: Path, cwd: Path) -> list:
    """``status --json``'s rows (exit 0, or 1 when a run failed)."""
    proc = run_hpctrain(["status", str(sweep), "--json"], cwd=cwd, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)["runs"]


def skipped(stdout: str) -> str:
    """A rerun's one line naming the runs it skipped as completed ("" when there is none)."""
    return next((line for line in stdout.splitlines() if "already completed by the same code:" in line), "")


def tb_scalars(run_dir: Path, tag: str) -> List[float]:
    """Values of one scalar tag, read with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]
