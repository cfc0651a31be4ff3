"""A real preemption on the test cluster (PreemptMode=REQUEUE): a job of the higher-tier partition
``urgent`` needs the node of a run on ``debug`` (GraceTime=20) or ``short`` (no grace time).

What Slurm does (docs/decisions.md, 2026-12-02): with a grace time the job steps get SIGTERM (not the batch
shell) while the job stays RUNNING with ``PreemptTime`` set; 20 s later (or at once without a grace time)
Slurm requeues the job: JobState=COMPLETING, ``Restarts`` one more, and everything, batch shell included,
gets SIGTERM, then SIGKILL KillWait (5 s here) later.
"""

import json
import subprocess

import pytest

from cli_helpers import run_hpctrain
from hpctrain.core import events
from hpctrain.slurm import parse
from isolation import MODES, Mode, mode_for, ran_contained
from slurm_helpers import metrics, record_kinds, run_dirs, wait_for

# a run that takes a whole node (2 CPUs), so that any urgent job on that node must preempt it
SLOW = ["max_steps=3000", "log_every=20", "eval_every=0", "ckpt_every=500", "model._target_=user_models.SlowDropout",
        "+model.delay_s=0.005", "+model.first_attempt_only=true", "hydra/launcher=slurm",
        "hydra.launcher.cpus_per_task=2"]

# `scontrol show job -o` as the test cluster (Slurm 22.05.8) printed it, trimmed to the fields that matter
GRACE = ("JobId=1654 JobName=wrap JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
         "ExitCode=0:0 EndTime=Unknown PreemptEligibleTime=2026-12-02T02:08:55 PreemptTime=2026-12-02T02:08:59 "
         "Partition=debug")  # a preemption's grace time, seen by the step's SIGTERM
TERM_ONLY = ("JobId=1716 JobName=wrap JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
             "ExitCode=0:0 EndTime=Unknown PreemptEligibleTime=2026-12-02T02:19:57 PreemptTime=None "
             "Partition=debug")  # scancel --signal=TERM
REQUEUED = ("JobId=1713 JobName=wrap JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=1 "
            "BatchFlag=1 ExitCode=0:0 StartTime=2026-12-02T02:19:47 EndTime=2026-12-02T02:29:47 SuspendTime=None "
            "Partition=short")  # preempted without a grace time (or at its end): Slurm requeued it
CANCELLED = ("JobId=1714 JobName=wrap JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
             "BatchFlag=1 ExitCode=0:15 EndTime=2026-12-02T02:19:46 PreemptEligibleTime=2026-12-02T02:19:42 "
             "PreemptTime=None Partition=debug")  # a plain scancel
NODE_DOWN = ("JobId=1846 JobName=wrap JobState=PENDING Reason=None Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 "
             "ExitCode=0:0 StartTime=2026-12-02T02:54:08 EndTime=2027-12-02T02:54:08 "
             "Partition=debug")  # scontrol update nodename=n2 state=down under it: requeued for the node failure


def test_what_the_real_scontrol_lines_mean():
    from hpctrain.job.preemption import Term, term_meaning

    job = parse.parse_fields
    assert term_meaning(job(GRACE), restarts=0) is Term.PREEMPTION
    assert term_meaning(job(TERM_ONLY), restarts=0) is Term.PREEMPTION
    assert term_meaning(job(REQUEUED), restarts=0) is Term.REQUEUED
    assert term_meaning(job(CANCELLED), restarts=0) is Term.END
    assert term_meaning(job(NODE_DOWN), restarts=0) is Term.END  # as before: test_record_slurm's node failure
    # a later attempt (SLURM_RESTART_COUNT=1) cancelled: Restarts is not more than the attempt's own
    assert term_meaning(job(REQUEUED), restarts=1) is Term.END


def _urgent_on_node_of(job: str) -> str:
    node = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    assert node in ("n1", "n2"), node
    out = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-w", node, "--exclusive", "-o", "/dev/null",
                          "--wrap", "sleep 5"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _sacct_states(job: str) -> list:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", job, "-o", "State"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.fixture(params=MODES)
def mode(request, tmp_path):
    """Bare, or inside a container that hides Slurm from the job (issue 27): the same test either way."""
    return mode_for(request.param, tmp_path)


BARE = Mode("bare")


def _preempted(tmp_path, extra, n_runs=1, mode=BARE):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", *SLOW, *extra, f"hydra.sweep.dir={sweep}", *mode.args], cwd=tmp_path, timeout=120,
                 env=mode.env)
    job = json.loads((sweep / "sweep.json").read_text())["runs"]["0"]["job_id"]
    wait_for(lambda: len(run_dirs(sweep)) == n_runs and all(metrics(d).get("step", 0) >= 600 for d in run_dirs(sweep)),
             240, "the runs past their first checkpoint")
    return sweep, job, _urgent_on_node_of(job)


def _ended(job: str) -> None:
    """Wait until sacct has the job's last attempt ended (cleaning up earlier would cancel its teardown)."""
    wait_for(lambda: _sacct_states(job)[-1:] == ["COMPLETED"], 60, "sacct to record the end")


def _log(sweep, stream: str = "err") -> str:
    return "".join(p.read_text() for p in (sweep / ".submitit").rglob(f"*_log.{stream}"))


def _checkpointed_at_the_signal(run) -> None:
    """The record as for a USR2 preemption; the resumed attempt starts where the signal stopped the run."""
    wait_for(lambda: metrics(run).get("status") == "completed", 240, "the run to complete")
    assert record_kinds(run) == ["submitted", "started", "requeued", "started", "completed"]
    (requeue,) = [e.data() for e in events.events(run) if e.kind == "requeued"]
    stopped = requeue["step"]
    assert 600 <= stopped < 3000 and requeue["checkpoint_step"] == stopped  # not the periodic one (500)
    assert f"at step {stopped}" in (run / "hpctrain.log").read_text()  # resumed from that checkpoint
    assert metrics(run)["step"] == 3000
    assert [e.data().get("slurm_restart_count") for e in events.events(run) if e.kind == "started"] == [None, 1]


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_preemption_with_a_grace_time_checkpoints_requeues_and_resumes(tmp_path, mode):
    sweep, job, urgent = _preempted(tmp_path, ["seed=0"], mode=mode)
    try:
        (run,) = run_dirs(sweep)
        wait_for(lambda: "requeued" in record_kinds(run), 30, "the checkpoint in the grace time")
        _checkpointed_at_the_signal(run)
        _ended(job)
        assert _sacct_states(job) == ["REQUEUED", "COMPLETED"]  # hpctrain requeued it within the grace time
        assert _sacct_states(urgent) == ["COMPLETED"]
        assert "SIGTERM with the job still running" in _log(sweep)
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job, urgent], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_packed_task_preempted_with_a_grace_time_checkpoints_its_runs(tmp_path):
    sweep, job, urgent = _preempted(tmp_path, ["seed=range(2)", "hydra.launcher.runs_per_task=2"], n_runs=2)
    try:
        for run in run_dirs(sweep):
            _checkpointed_at_the_signal(run)
        _ended(job)
        assert _sacct_states(job) == ["REQUEUED", "COMPLETED"]
        assert "hpctrain pack: SIGTERM with the job still running" in _log(sweep, "out")  # the task's parent
    finally:
        subprocess.run(["scancel", job, urgent], capture_output=True)


NO_GRACE = ["hydra.launcher.partition=short", "hydra.launcher.timeout_min=10"]


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_preemption_without_grace_time_checkpoints_before_the_kill_and_resumes(tmp_path, mode):
    """On ``short`` (no grace time) Slurm requeues the job at once; its SIGKILL comes KillWait (5 s) after
    the SIGTERM: time for the checkpoint, recorded as for USR2, with no requeue of hpctrain's own; in the
    container the question what the SIGTERM means is answered by the host side within those 5 s."""
    import hpctrain

    sweep, job, urgent = _preempted(tmp_path, ["seed=0", *NO_GRACE], mode=mode)
    try:
        (run,) = run_dirs(sweep)
        _checkpointed_at_the_signal(run)
        _ended(job)
        assert _sacct_states(job) == ["PREEMPTED", "COMPLETED"]  # Slurm's requeue, not hpctrain's (REQUEUED)
        log = _log(sweep)
        assert "SIGTERM with the job already requeued by Slurm" in log
        assert "cannot say whether the job is preempted" not in log  # its scontrol outlived the second SIGTERM
        cost = hpctrain.load(sweep).runs[0].cost
        assert (cost.attempts, cost.requeues, cost.redone_steps, cost.redone_unknown) == (2, 1, 0, 0)
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job, urgent], capture_output=True)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_packed_task_preempted_without_grace_time_checkpoints_its_runs(tmp_path, mode):
    sweep, job, urgent = _preempted(tmp_path, ["seed=range(2)", "hydra.launcher.runs_per_task=2", *NO_GRACE],
                                    n_runs=2, mode=mode)
    try:
        for run in run_dirs(sweep):
            _checkpointed_at_the_signal(run)
        _ended(job)
        assert _sacct_states(job) == ["PREEMPTED", "COMPLETED"]
        assert "SIGTERM with the job already requeued by Slurm" in _log(sweep)
        assert ran_contained(tmp_path) == mode.contained
    finally:
        subprocess.run(["scancel", job, urgent], capture_output=True)
