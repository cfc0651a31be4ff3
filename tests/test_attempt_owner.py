"""An attempt ends only its own (hpctrain/job/attempt_ended.py): the teardown of a Slurm job whose run the
record says another job is running (an orphan array of an interrupted submission, its runs submitted again)
writes nothing into that run's record and asks no requeue. The teardown runs as the job script runs it."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest

from hpctrain.core.state import State
from hpctrain.core import events, manifest
from hpctrain.core.run import RunSpec

pytestmark = pytest.mark.login

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT")


def as_job(monkeypatch: pytest.MonkeyPatch, job: Optional[str]) -> None:
    """This process writes as Slurm job ``job`` (restart 0) would; None: outside Slurm."""
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    if job is not None:
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")


def sweep_of_one_run(tmp_path: Path, job_id: Optional[str]) -> "tuple[Path, Path]":
    sweep = tmp_path / "sweep"
    spec = RunSpec(0, ("x=1",), sweep / "0_x=1", None)

    def add(m: manifest.Manifest) -> None:
        m.launcher = "slurm"
        m.runs[0] = manifest.RunEntry(spec, job_id)

    manifest.update(sweep, add)
    runs = sweep / ".hpctrain" / "submission-1.runs.json"
    runs.write_text(json.dumps({"sweep_dir": str(sweep), "tasks": [[spec.to_json(sweep)]]}))
    return runs, spec.run_dir


def teardown(runs: Path, job: str, exit_code: int, max_retries: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in SLURM_VARS}
    env.update(SLURM_JOB_ID=job, SLURM_RESTART_COUNT="0", PATH="/nonexistent")  # no scontrol: nothing requeued
    return subprocess.run([sys.executable, "-m", "hpctrain.job.attempt_ended", str(runs), "0", str(exit_code),
                           str(max_retries)], env=env, capture_output=True, text=True, timeout=60)


def kinds(run_dir: Path) -> List[str]:
    return [e.kind.value for e in events.events(run_dir)]


def test_a_teardown_leaves_a_run_another_job_is_running_alone(tmp_path, monkeypatch):
    runs, run_dir = sweep_of_one_run(tmp_path, "901")
    as_job(monkeypatch, None)
    events.submitted(run_dir)
    as_job(monkeypatch, "901")
    events.started(run_dir, job_id="901")
    orphan = teardown(runs, "900", 1, max_retries=2)
    assert orphan.returncode == 0, orphan.stderr
    assert "another job's attempt" in orphan.stderr
    assert kinds(run_dir) == ["submitted", "started"] and events.read(run_dir).state is State.RUNNING
    own = teardown(runs, "901", 1, max_retries=0)  # its own job's teardown still records the silent death
    assert own.returncode == 0, own.stderr
    assert kinds(run_dir) == ["submitted", "started", "failed"]


def test_a_teardown_leaves_a_queued_run_of_another_jobs_submission_alone(tmp_path, monkeypatch):
    runs, run_dir = sweep_of_one_run(tmp_path, "901")  # sweep.json: run 0 is job 901's
    as_job(monkeypatch, None)
    events.submitted(run_dir)
    orphan = teardown(runs, "900", 1, max_retries=2)
    assert orphan.returncode == 0, orphan.stderr
    assert kinds(run_dir) == ["submitted"]
    own = teardown(runs, "901", 1, max_retries=0)  # job 901's tasks died before the run started
    assert kinds(run_dir) == ["submitted", "failed"], own.stderr


def test_a_retry_is_left_to_the_job_that_decided_it(tmp_path, monkeypatch):
    runs, run_dir = sweep_of_one_run(tmp_path, "901")
    as_job(monkeypatch, None)
    events.submitted(run_dir)
    as_job(monkeypatch, "901")
    events.started(run_dir, job_id="901")
    events.failed(run_dir, "RuntimeError: boom", rank=0)
    events.retrying(run_dir, 1, 2)
    orphan = teardown(runs, "900", 1, max_retries=2)
    assert orphan.returncode == 0, orphan.stderr
    assert kinds(run_dir) == ["submitted", "started", "failed", "retrying"]
    assert events.read(run_dir).retries == 1  # its budget untouched


def search_of_three_workers(tmp_path: Path) -> "tuple[Path, List[Path]]":
    """A search's sweep.json as its workers leave it: runs 0..2 are trials (trial 0 run by worker 1, trial 2
    by worker 2), the submission's workers are 750_0..750_2; the run list's tasks are their placeholders."""
    from hpctrain.core.paths import SweepPaths

    sweep = tmp_path / "sweep"
    places = [SweepPaths(sweep).worker_placeholder(i) for i in range(3)]

    def add(m: manifest.Manifest) -> None:
        m.launcher = "slurm"
        for trial, job in enumerate(["750_1", "750_0", "750_2"]):
            m.runs[trial] = manifest.RunEntry(RunSpec(trial, ("lr=0.1",), sweep / f"trial-{trial:03d}", None), job)
        m.submissions.append(manifest.SubmissionRecord(time=0.0, job_ids=["750"], runs=[],
                                                       extra={"worker_job_ids": ["750_0", "750_1", "750_2"]}))

    manifest.update(sweep, add)
    runs = sweep / ".hpctrain" / "submission-0.runs.json"
    tasks = [[RunSpec(i, ("lr=0.1",), p, None).to_json(sweep)] for i, p in enumerate(places)]
    runs.write_text(json.dumps({"sweep_dir": str(sweep), "tasks": tasks}))
    for p in places:
        events.submitted(p)
    return runs, places


def worker_teardown(runs: Path, task: int, exit_code: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in SLURM_VARS}
    env.update(SLURM_JOB_ID=str(750 if task == 2 else 751 + task), SLURM_ARRAY_JOB_ID="750",
               SLURM_ARRAY_TASK_ID=str(task), SLURM_RESTART_COUNT="0", PATH="/nonexistent")
    return subprocess.run([sys.executable, "-m", "hpctrain.job.attempt_ended", str(runs), str(task), str(exit_code),
                           "1"], env=env, capture_output=True, text=True, timeout=60)


def test_a_sigkilled_search_worker_is_recorded_and_never_requeued_whichever_trials_it_ran(tmp_path, monkeypatch):
    """A worker's task is looked up among the submission's workers, not among the trials that share its index:
    worker 2, which happened to run trial 2, was requeued (its trial then taken back as its own, no adoption
    counted), worker 0 was left alone. Each now records its death and asks no requeue (none is possible here:
    no scontrol), so that another worker adopts what it held."""
    as_job(monkeypatch, None)
    runs, places = search_of_three_workers(tmp_path)
    for task in (2, 0):
        ended = worker_teardown(runs, task, 137)
        assert ended.returncode == 0, ended.stderr
        assert kinds(places[task]) == ["submitted", "failed"], ended.stderr
        assert "not requeued" in ended.stderr and "retry" not in ended.stderr, ended.stderr
    assert kinds(places[1]) == ["submitted"]
