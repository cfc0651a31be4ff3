"""One run dir, decided on the login node: a run-dir template Hydra would resolve differently in the job
(``${hydra.job.id}``, a resolver) still puts every output of a run into the dir the plan recorded, on both
launchers; and constant keys are left out of names once per sweep, whatever the batches."""

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from cli_helpers import HELPERS, hpctrain_env, run_hpctrain, skipped
from slurm_helpers import metrics, record_kinds

APP = HELPERS / "resolver_app.py"
JOB_ID_SUBDIR = "hydra.sweep.subdir=${hydra.job.num}_${hydra.job.id}"
RESOLVER_SUBDIR = "hydra.sweep.subdir=${hydra.job.num}_${where:}_${hydra.job.id}"
SMALL = ["max_steps=20", "log_every=10", "eval_every=10", "ckpt_every=10"]


def sweep_app(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(APP), "-m", *args], cwd=cwd, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=300)


def review(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=120)


def planned_dirs(sweep: Path) -> List[Path]:
    """The run dirs sweep.json records, by run index."""
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    return [sweep / runs[k]["run_dir"] for k in sorted(runs, key=int)]


def outputs_outside(sweep: Path, planned: List[Path]) -> List[str]:
    """Directories of the sweep dir that are no planned run dir (where a re-resolved subdir would go)."""
    return sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".") and p not in planned)


def check_trainer_outputs(sweep: Path, proc: subprocess.CompletedProcess) -> None:
    planned = planned_dirs(sweep)
    assert [p.name for p in planned] == ["0_plan_0", "1_plan_1"], planned
    assert outputs_outside(sweep, planned) == [], proc.stdout + proc.stderr
    for run_dir in planned:
        assert metrics(run_dir)["status"] == "completed" and metrics(run_dir)["step"] == 20
        assert (run_dir / "checkpoints" / "last.pt").is_file()
        assert any((run_dir / "tb").iterdir())
        assert (run_dir / ".hydra" / "config.yaml").is_file()
    status = review(["status", str(sweep)], sweep.parent)
    assert status.stdout.splitlines()[-1] == "2 runs: 2 completed", status.stdout + status.stderr
    report = review(["report", str(sweep)], sweep.parent)
    assert report.returncode == 0 and "best: #" in report.stdout, report.stdout + report.stderr


def check_app_outputs(sweep: Path, proc: subprocess.CompletedProcess) -> None:
    planned = planned_dirs(sweep)
    assert [p.name for p in planned] == ["0_login_plan_0", "1_login_plan_1", "2_login_plan_2"], planned
    assert outputs_outside(sweep, planned) == [], proc.stdout + proc.stderr
    zero, one, three = planned
    assert metrics(zero)["metrics"] == {"loss": 1.0} and metrics(one)["metrics"] == {"loss": 0.0}
    assert (zero / ".hydra" / "overrides.yaml").is_file()
    failed = metrics(three)
    assert failed["status"] == "failed" and "x=3.0 is above fail_above=2" in failed["error"]
    assert record_kinds(three) == ["submitted", "started", "failed", "retrying", "started", "failed"]
    status = review(["status", str(sweep)], sweep.parent)
    assert status.stdout.splitlines()[-1] == "3 runs: 2 completed, 1 failed", status.stdout + status.stderr
    report = review(["report", str(sweep), "--metric", "loss", "--mode", "min"], sweep.parent)
    assert report.returncode == 0 and "best: #1 x=1" in report.stdout, report.stdout + report.stderr


def test_job_id_in_the_subdir_local(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "lr=1e-3,1e-4", *SMALL, "hydra/launcher=local", JOB_ID_SUBDIR, f"hydra.sweep.dir={sweep}"]
    proc = run_hpctrain(args, cwd=tmp_path)
    check_trainer_outputs(sweep, proc)
    # said once, in one line: the job id is not known when the dir is decided
    noted = [line for line in proc.stderr.splitlines() if "${hydra.job.id}" in line]
    assert len(noted) == 1 and "run dirs hold plan_N" in noted[0], proc.stderr
    again = run_hpctrain(args, cwd=tmp_path)  # a rerun sees the outputs: nothing left to run
    assert "all 2 runs of" in again.stdout and "already completed" in again.stdout, again.stdout


def test_resolver_in_the_subdir_local(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["+x=0,1,3", "+fail_above=2", "hydra/launcher=local", "hydra.launcher.max_retries=1", RESOLVER_SUBDIR,
            f"hydra.sweep.dir={sweep}"]
    proc = sweep_app(args, tmp_path)
    assert proc.returncode != 0 and "1 of 3 run(s) failed" in proc.stderr, proc.stdout + proc.stderr
    check_app_outputs(sweep, proc)
    again = sweep_app(args[:1] + ["+fail_above=5"] + args[2:], tmp_path)  # a changed point: only it runs
    assert "0_login_plan_0, 1_login_plan_1" in skipped(again.stdout), again.stdout
    assert again.returncode == 0, again.stdout + again.stderr
    assert metrics(planned_dirs(sweep)[2])["status"] == "completed"


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_job_id_and_resolver_in_the_subdir_slurm(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "lr=1e-3,1e-4", *SMALL, "hydra/launcher=slurm", "hydra.launcher.wait=true", JOB_ID_SUBDIR,
            f"hydra.sweep.dir={sweep}"]
    proc = run_hpctrain(args, cwd=tmp_path, timeout=600)
    check_trainer_outputs(sweep, proc)

    other = tmp_path / "other"
    app_args = ["+x=0,1,3", "+fail_above=2", "hydra/launcher=slurm", "hydra.launcher.wait=true",
                "hydra.launcher.max_retries=1", RESOLVER_SUBDIR, f"hydra.sweep.dir={other}"]
    proc = sweep_app(app_args, tmp_path)
    assert proc.returncode != 0 and "1 of 3 run(s) failed" in proc.stderr, proc.stdout + proc.stderr
    check_app_outputs(other, proc)
    again = sweep_app(app_args[:1] + ["+fail_above=5"] + app_args[2:], tmp_path)
    assert "0_login_plan_0, 1_login_plan_1" in skipped(again.stdout), again.stdout
    assert again.returncode == 0, again.stdout + again.stderr
    assert metrics(planned_dirs(other)[2])["status"] == "completed"


def _dry_run_dirs(stdout: str) -> List[str]:
    return [line.split()[1] for line in stdout.splitlines()
            if line.startswith("  ") and len(line.split()) == 2 and line.split()[0].isdigit()]


@pytest.mark.parametrize("launcher", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_constant_keys_are_found_once_per_sweep(tmp_path, launcher):
    common = ["-m", "lr=1e-3,1e-4", "seed=0,1", "max_steps=7", f"hydra/launcher={launcher}",
              "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    whole = _dry_run_dirs(run_hpctrain(common, cwd=tmp_path).stdout)
    batched = _dry_run_dirs(run_hpctrain(common + ["hydra.sweeper.max_batch_size=2"], cwd=tmp_path).stdout)
    names = [Path(d).name for d in whole]
    assert names == ["0_lr=0.001,seed=0", "1_lr=0.001,seed=1", "2_lr=0.0001,seed=0", "3_lr=0.0001,seed=1"]
    assert batched == whole
