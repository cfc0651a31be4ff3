"""Pull workers for a grid sweep (``hydra.launcher.workers=W``, or the queue cap): W tasks pull the points
until all are done, each point run exactly once, under the faults a search's workers survive (a worker
scancelled mid-point, its node set down, the same command again, a slow squeue). Counted from the run dirs:
one dir per point, each completed once."""

import json
import subprocess
import sys
from pathlib import Path
from typing import List


from cli_helpers import HELPERS, hpctrain_env
from slurm_helpers import record_kinds, run_dirs

APP = HELPERS / "foreign_app.py"


def sweep_app(args, cwd: Path, env=None, timeout: float = 300, wait: bool = True):
    cmd = [sys.executable, str(APP), "-m", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env or hpctrain_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=cwd, env=env or hpctrain_env(), capture_output=True, text=True, timeout=timeout)


def exactly_once(sweep: Path, n: int) -> List[List[str]]:
    """One run dir per point, each completed once (the records), none running twice at once."""
    dirs = run_dirs(sweep)
    assert len(dirs) == n, [d.name for d in dirs]
    kinds = [record_kinds(d) for d in dirs]
    for d, k in zip(dirs, kinds):
        assert k.count("completed") == 1 and k[-1] == "completed", (d.name, k)
    return kinds


def worker_stats(sweep: Path) -> List[dict]:
    return [json.loads(p.read_text()) for p in sorted((sweep / ".hpctrain" / "workers").glob("pull-*.json"))]


def test_two_local_workers_pull_six_points_each_once(tmp_path):
    sweep = tmp_path / "s"
    proc = sweep_app(["+x=range(6)", "+sleep_s=0.2", "hydra/launcher=local", "hydra.launcher.workers=2",
                      f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pulled by 2 worker(s)" in proc.stdout
    kinds = exactly_once(sweep, 6)
    assert all(k == ["submitted", "started", "completed"] for k in kinds), kinds
    stats = worker_stats(sweep)
    assert len(stats) == 2 and sum(s["points"] for s in stats) == 6 and all(s["points"] >= 1 for s in stats), stats
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep)], cwd=tmp_path,
                            env=hpctrain_env(), capture_output=True, text=True, timeout=120)
    assert status.stdout.splitlines()[-1] == "6 runs: 6 completed", status.stdout
    again = sweep_app(["+x=range(6)", "+sleep_s=0.2", "hydra/launcher=local", "hydra.launcher.workers=2",
                       f"hydra.sweep.dir={sweep}"], tmp_path)
    assert "all 6 runs of" in again.stdout and "already completed" in again.stdout, again.stdout
    exactly_once(sweep, 6)
