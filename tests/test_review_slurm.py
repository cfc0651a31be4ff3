"""status and cancel on the real Slurm test cluster.

The sweep is slow on purpose (a huge max_steps, one task at a time) so that it is caught running and
pending; whatever happens, its array is cancelled at the end.
"""

import json
import subprocess
import sys

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain

pytestmark = pytest.mark.slurm
sys.path.insert(0, str(HELPERS))
from slurm_helpers import cancel, job_id, queued, wait_for  # noqa: E402


def review(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=120)


def states(sweep, cwd) -> list:
    proc = review(["status", str(sweep), "--json"], cwd)
    assert proc.returncode in (0, 1), proc.stderr
    return [r["state"] for r in json.loads(proc.stdout)["runs"]]


def test_status_and_cancel_on_slurm(tmp_path, slurm_cluster):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "lr=1e-2,1e-3,1e-4", "max_steps=1000000", "hydra/launcher=slurm",
                  "hydra.launcher.array_parallelism=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    array = job_id(sweep)
    try:
        wait_for(lambda: states(sweep, tmp_path) == ["running", "queued", "queued"], 180,
                 "run 0 running, runs 1-2 queued")
        proc = review(["status", str(sweep)], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.split()[:1] in (["0"], ["1"], ["2"])}
        assert " running " in rows["0"] and f"{array}_0_0_log.out" in rows["0"]
        assert " queued " in rows["1"] and " queued " in rows["2"]
        assert proc.stdout.splitlines()[-1] == "3 runs: 2 queued, 1 running"

        # one pending task only
        proc = review(["cancel", str(sweep), "--run", "2"], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert states(sweep, tmp_path) == ["running", "queued", "cancelled"]
        assert not [line for line in queued(array) if line.startswith(f"{array}_2 ")]

        # the rest of the array
        proc = review(["cancel", str(sweep)], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines()[-1] == "3 runs: 3 cancelled"
        assert states(sweep, tmp_path) == ["cancelled"] * 3
        wait_for(lambda: not queued(array), 60, f"array {array} to leave the queue")
        after = review(["status", str(sweep)], tmp_path)
        assert after.returncode == 0 and after.stdout.splitlines()[-1] == "3 runs: 3 cancelled"
        assert "nothing to cancel" in review(["cancel", str(sweep)], tmp_path).stdout
    finally:
        cancel(array)
