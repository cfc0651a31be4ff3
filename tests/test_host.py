"""The host side of a job (issue 27): the batch script's helper answers the job step's request files, so that
nothing inside the job's container calls Slurm; a requeue that fails leaves the record failed, not requeued.

The helper here is the batch script's own lines (hpctrain.submit.backends.slurm.host_lines) run by bash; the
fast tests give it requests that need no Slurm (refused ones, a missing scontrol); tests/test_container_matrix.py
runs it in real jobs.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.core import events
from hpctrain.core.state import REQUEUE_FAILED, State
from hpctrain.job.preemption import Term, ended_as, term_meaning
from hpctrain.slurm import host, parse
from hpctrain.submit.backends.slurm import host_lines

# `scontrol show job -o` of the test cluster, trimmed: the time limit's SIGTERM (measured 2026-12-04)
TIME_LIMIT = ("JobId=34 JobName=tl.sh JobState=COMPLETING Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 "
              "BatchFlag=1 ExitCode=0:0 Partition=debug")
CANCELLED = ("JobId=1714 JobName=wrap JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
             "BatchFlag=1 ExitCode=0:15 Partition=debug")


@pytest.fixture
def helper(tmp_path, monkeypatch):
    """The batch script's helper lines in a bash that waits, with no Slurm tool on its PATH."""
    yield from _helper(tmp_path, monkeypatch, {"SLURM_JOB_ID": "77"})


@pytest.fixture
def array_helper(tmp_path, monkeypatch):
    """The helper of the array task that holds the array's record: its SLURM_JOB_ID is the array's."""
    yield from _helper(tmp_path, monkeypatch, {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "77",
                                               "SLURM_ARRAY_TASK_ID": "2"})


def _helper(tmp_path, monkeypatch, slurm_env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sleep", "touch", "head", "mv", "rm", "mkdir"):
        (bin_dir / tool).symlink_to(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip())
    script = "\n".join(host_lines(tmp_path / "sweep") + ["sleep 60"])
    proc = subprocess.Popen(["bash", "-c", script], env={"PATH": str(bin_dir), **slurm_env}, start_new_session=True)
    where = tmp_path / "sweep" / ".hpctrain" / "host" / "77"
    deadline = time.time() + 10
    while not (where / host.HEARTBEAT).exists() and time.time() < deadline:
        time.sleep(0.05)
    monkeypatch.setenv(host.HOST_DIR_ENV, str(where))
    yield proc, where
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the test ended it itself
        pass
    proc.wait()


def test_outside_a_batch_job_there_is_no_host_side_to_ask(monkeypatch):
    monkeypatch.delenv(host.HOST_DIR_ENV, raising=False)
    ans = host.requeue()
    assert ans.stdout is None and "no host-side helper" in ans.error


def test_the_helper_answers_within_a_second_and_its_errors_are_unknown(helper):
    proc, where = helper
    start = time.time()
    ans = host.show_job(timeout_s=10)  # no scontrol on this PATH: the shell says so, exit 127
    assert time.time() - start < 2
    assert ans.stdout is None and ans.returncode == 127 and "scontrol" in ans.error, ans
    assert host.squeue(["12", "13_4"], timeout_s=10) is None  # unknown, never an empty queue
    assert not list(where.glob("*.ask")) and not list(where.glob("*.answer"))  # each request answered once


def test_the_helper_runs_no_job_ids_but_digits(helper):
    _, where = helper
    ans = host.ask(host.Request.SQUEUE, "12;touch pwned", timeout_s=10)
    assert ans.stdout is None and ans.returncode == 2 and "bad job ids" in ans.error
    ans = host.ask(host.Request.SQUEUE, "$(touch pwned)", timeout_s=10)
    assert ans.stdout is None and ans.returncode == 2
    assert not list(Path(where).parent.rglob("pwned")) and not Path("pwned").exists()


def test_a_gone_helper_is_unknown_within_two_seconds(helper):
    proc, where = helper
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.2)
    start = time.time()
    ans = host.requeue(timeout_s=30)
    assert ans.stdout is None and "gone" in ans.error
    assert time.time() - start < host.STALE_S + 0.5


def test_a_torn_answer_is_unknown():
    assert host.parse_answer("JobId=1 JobState=RUN", host.Request.SHOW).stdout is None
    assert host.parse_answer("JobId=1\nrc=0\n", host.Request.SHOW).stdout == "JobId=1\n"
    assert host.parse_answer("Invalid job id specified\nrc=1\n", host.Request.SQUEUE).error == "Invalid job id specified"


def test_the_end_of_a_job_says_cancelled_or_timeout():
    job = parse.parse_fields
    assert term_meaning(job(TIME_LIMIT), 0) is Term.END and ended_as(job(TIME_LIMIT)) == "timeout"
    assert term_meaning(job(CANCELLED), 0) is Term.END and ended_as(job(CANCELLED)) == "cancelled"
    assert ended_as({}) is None  # no answer: nothing recorded
    assert ended_as({"JobState": "PENDING", "Reason": "None"}) is None  # a node failure requeued it


def test_a_failed_requeue_leaves_the_record_failed_and_the_retry_budget_decides(tmp_path):
    """The requeue was written before the host side tried it (submitit's checkpoint() first): the attempt's
    failure saying the requeue failed outranks it, and no requeue is counted."""
    run = tmp_path / "run"
    events.submitted(run)
    events.started(run, job_id="5")
    events.requeued(run)
    assert events.read(run).state is State.REQUEUED
    events.failed(run, f"hpctrain.job.preemption.RequeueFailed: {REQUEUE_FAILED}: scontrol: not found", rank=0)
    rs = events.read(run)
    assert rs.state is State.FAILED and rs.requeues == 0 and REQUEUE_FAILED in rs.error
    assert events.retry_allowed(run, 1) == 1
    events.retrying(run, 1, 1)
    assert events.read(run).state is State.RETRYING
    events.failed(run, f"retry not possible: {REQUEUE_FAILED} (scontrol requeue 5): scontrol: not found")
    assert events.read(run).state is State.FAILED
    assert events.retry_allowed(run, 1) is None  # the budget is used up


def test_a_requeue_with_the_fallout_of_other_ranks_stays_requeued(tmp_path):
    run = tmp_path / "run"
    events.submitted(run)
    events.started(run, job_id="5")
    events.requeued(run)
    events.failed(run, "RuntimeError: Connection closed by peer", rank=1)
    rs = events.read(run)
    assert rs.state is State.REQUEUED and rs.requeues == 1


def test_cleanenv_is_refused_on_the_login_node_with_the_reason(tmp_path):
    """`container.args=[--cleanenv]` made every task fail at its start (submitit: "Could not figure out which
    environment the job is running in"): refused before anything is submitted, one line, the key named."""
    from cli_helpers import run_hpctrain
    from hpctrain.submit.container import check_args

    assert check_args(["--writable-tmpfs"]) == []
    for option in ("--cleanenv", "-e", "--containall", "-C"):
        (problem,) = check_args(["--nv", option])
        assert problem.startswith("hydra.launcher.container.args: ") and "SLURM_" in problem
    image = tmp_path / "img.sif"
    image.touch()
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "max_steps=5", "hydra/launcher=local", f"hydra.launcher.container.image={image}",
                         "hydra.launcher.container.args=[--cleanenv]", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode != 0 and "container.args: --cleanenv drops the job's environment" in proc.stderr, proc
    assert "Traceback" not in proc.stderr and not (sweep / ".submitit").exists()


def test_a_slow_slurm_call_is_waited_for_once_the_helper_took_the_request(helper, tmp_path):
    """A busy controller: scontrol answers after 3 s, longer than the heartbeat's 2 s (the helper is busy
    running it); the request was taken, so the answer is waited for."""
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text("#!/bin/bash\nsleep 3\necho \"JobId=$4 JobState=RUNNING Reason=None Restarts=0\"\n")
    scontrol.chmod(0o755)
    ans = host.show_job(timeout_s=20)
    assert ans.stdout is not None and parse.parse_fields(ans.stdout.strip())["JobState"] == "RUNNING", ans
    assert parse.parse_fields(ans.stdout.strip())["JobId"] == "77"


def test_an_array_task_asks_slurm_about_itself_never_the_whole_array(array_helper, tmp_path):
    """`scontrol requeue 77` from task 77_2, whose SLURM_JOB_ID is the array's, requeued all three tasks of the
    array (measured on the test cluster, 2026-12-04): a retry of one SIGKILLed search worker killed the
    other two mid-unit. Each request names the task itself."""
    said = tmp_path / "said"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f"#!/bin/bash\necho \"$*\" >>{said}\necho \"JobId=77 ArrayJobId=77 ArrayTaskId=2\"\n")
    scontrol.chmod(0o755)
    assert host.requeue(timeout_s=10).stdout is not None
    assert host.show_job(timeout_s=10).stdout is not None
    assert host.ask(host.Request.EXCLUDE, "n1", timeout_s=10).stdout is not None
    assert said.read_text().splitlines() == ["requeue 77_2", "show job -o 77_2", "requeuehold 77_2",
                                             "update jobid=77_2 ExcNodeList=n1", "release 77_2"]
