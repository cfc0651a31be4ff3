"""Preemption by SIGTERM with a grace time (PreemptMode=REQUEUE, no user signal) is a preemption; a user's
plain ``scancel`` stays a cancel (issue 19, item 14).

Slurm tells them apart by the job's state: a plain scancel (and the time limit, a requeue) has ended the
job by the time its SIGTERM comes; a preemption's grace time, like ``scancel --signal=TERM`` (the signal
without the kill) used here, leaves it RUNNING.
"""

import json
import subprocess

import pytest

from cli_helpers import run_hpctrain
from hpctrain.job.preemption import Term, term_meaning
from isolation import MODES, mode_for, ran_contained
from slurm_helpers import metrics, queued, record_kinds, run_dirs, wait_for

SLOW = ["max_steps=3000", "log_every=20", "eval_every=0", "ckpt_every=0", "model._target_=user_models.SlowDropout",
        "+model.delay_s=0.005", "+model.first_attempt_only=true", "hydra/launcher=slurm"]


def test_the_job_state_tells_a_preemption_from_a_cancel():
    assert term_meaning({"JobState": "RUNNING", "Reason": "None"}, 0) is Term.PREEMPTION
    assert term_meaning({"JobState": "PREEMPTED"}, 0) is Term.PREEMPTION
    for state in ("COMPLETING", "CANCELLED", "CANCELLED+", "TIMEOUT", "REQUEUED", "PENDING", "NODE_FAIL", ""):
        assert term_meaning({"JobState": state}, 0) is not Term.PREEMPTION, state


@pytest.fixture(params=MODES)
def mode(request, tmp_path):
    """Bare, or inside a container that hides Slurm from the job (issue 27): the same test either way."""
    return mode_for(request.param, tmp_path)


def _submit(tmp_path, extra, mode):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", *SLOW, *extra, f"hydra.sweep.dir={sweep}", *mode.args], cwd=tmp_path, timeout=120,
                 env=mode.env)
    manifest = json.loads((sweep / "sweep.json").read_text())
    return sweep, manifest["runs"]["0"]["job_id"]


def _under_way(sweep, n):
    wait_for(lambda: len(run_dirs(sweep)) == n and all(metrics(d).get("step", 0) >= 100 for d in run_dirs(sweep)),
             240, f"{n} run(s) under way")
    return run_dirs(sweep)


def _resumed_and_completed(dirs):
    wait_for(lambda: all("requeued" in record_kinds(d) for d in dirs), 90, "the runs to checkpoint on SIGTERM")
    for d in dirs:  # ckpt_every=0: the only checkpoint is the one the TERM asked for
        assert (d / "checkpoints" / "last.pt").exists()
    wait_for(lambda: all(metrics(d).get("status") == "completed" for d in dirs), 420, "the runs to complete")
    for d in dirs:
        kinds = record_kinds(d)
        assert kinds.count("started") == 2 and kinds[-1] == "completed", kinds
        assert "resumed from" in (d / "hpctrain.log").read_text()
        assert metrics(d)["step"] == 3000


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sigterm_with_the_job_running_checkpoints_and_requeues(tmp_path, mode):
    sweep, job = _submit(tmp_path, ["seed=0"], mode)
    try:
        dirs = _under_way(sweep, 1)
        subprocess.run(["scancel", "--signal=TERM", job], check=True)  # the job steps: TERM, no kill
        _resumed_and_completed(dirs)
        log = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
        assert "SIGTERM with the job still running" in log
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_sigterm_to_a_packed_task_checkpoints_and_requeues_its_runs(tmp_path, mode):
    sweep, job = _submit(tmp_path, ["seed=range(2)", "hydra.launcher.runs_per_task=2", "hydra.launcher.cpus_per_task=2"],
                         mode)
    try:
        dirs = _under_way(sweep, 2)
        subprocess.run(["scancel", "--signal=TERM", job], check=True)
        _resumed_and_completed(dirs)
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_plain_scancel_stays_a_cancel(tmp_path, mode):
    """...and ends the run at once, recorded cancelled (issue 26: the TERM was swallowed, training went on
    until the SIGKILL KillWait later)."""
    sweep, job = _submit(tmp_path, ["seed=0"], mode)
    try:
        (run,) = _under_way(sweep, 1)
        subprocess.run(["scancel", job], check=True)
        wait_for(lambda: not queued(job), 60, "the job to leave the queue")
        subprocess.run(["sleep", "5"])  # a requeue would bring it back now
        assert not queued(job)
        kinds = record_kinds(run)
        assert "requeued" not in kinds and kinds.count("started") == 1, kinds
        assert not (run / "checkpoints" / "last.pt").exists()  # no checkpoint for a cancel
        assert kinds[-1] == "cancelled" and metrics(run)["status"] == "cancelled", kinds
        log = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
        assert "SIGTERM ends the job (cancelled)" in log
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_plain_scancel_of_a_packed_task_ends_its_runs_at_once(tmp_path):
    """The task's parent tells the SIGTERM apart for its runs: the end of the job stops them now (in the
    container, where no scontrol exists: the host side answers), each recorded cancelled."""
    mode = mode_for("container", tmp_path)
    sweep, job = _submit(tmp_path, ["seed=range(2)", "hydra.launcher.runs_per_task=2", "hydra.launcher.cpus_per_task=2"],
                         mode)
    try:
        dirs = _under_way(sweep, 2)
        subprocess.run(["scancel", job], check=True)
        wait_for(lambda: not queued(job), 60, "the job to leave the queue")
        for run in dirs:
            kinds = record_kinds(run)
            assert "requeued" not in kinds and kinds.count("started") == 1 and kinds[-1] == "cancelled", kinds
        out = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.out"))
        assert "hpctrain pack: SIGTERM ends the job (cancelled): stopping 2 run(s)" in out
        assert ran_contained(tmp_path)
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)
