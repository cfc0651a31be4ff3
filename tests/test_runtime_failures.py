"""A run that dies leaves metrics.json with status failed and the error; the sweep goes on."""

import os
import signal
import time

import pytest

from cli_helpers import run_hpctrain
from hpctrain.core.state import State
from hpctrain.core import events
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_killed_task_is_recorded_failed_and_sibling_completes(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=100000,60", "log_every=20", "hydra/launcher=slurm", "hydra.launcher.max_retries=0",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=60)
    job = job_id(sweep)
    try:
        victim, sibling = sweep / "0_max_steps=100000", sweep / "1_max_steps=60"
        wait_for(lambda: metrics(victim).get("step", 0) >= 20, 120, "the run to be under way")
        # SIGKILL to the training process (as the OOM killer would): no Python handler can run
        os.kill(metrics(victim)["pid"], signal.SIGKILL)
        wait_for(lambda: metrics(victim).get("status") == "failed", 60, "the killed run to be marked failed")
        assert "ended with exit code" in metrics(victim)["error"]
        wait_for(lambda: metrics(sibling).get("status") == "completed", 120, "the sibling to complete")
        wait_for(lambda: not queued(job), 30, "the array to leave the queue")
    finally:
        cancel(job)


def test_exception_is_recorded_with_its_traceback_on_local(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "model._target_=user_models.Boom,user_models.TinyNet", "max_steps=10",
                         "hydra/launcher=local", "hydra.launcher.max_retries=0", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0
    boom, fine = run_dirs(sweep)
    record = metrics(boom)
    assert record["status"] == "failed"
    assert "RuntimeError: Boom: this model always fails" in record["error"]
    # the traceback's frames (its last lines), down to the line of the user's model that raised
    frames = record["error"].splitlines()
    assert frames[0].lstrip().startswith('File "'), record["error"]
    assert any('user_models.py", line' in f and f.endswith("in forward") for f in frames), record["error"]
    assert frames[-2].strip() == 'raise RuntimeError("Boom: this model always fails")', record["error"]
    assert metrics(fine)["status"] == "completed"


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_crash_of_rank_1_alone_takes_the_job_down_and_is_retried(tmp_path):
    """Rank 1 raises, rank 0 only sees the fallout: the step ends at once (not the collective timeout),
    the crash counts toward max_retries like rank 0's, and the run ends with rank 1's own error."""
    sweep = tmp_path / "sweep"
    start = time.time()
    proc = run_hpctrain(["-m", "model._target_=user_models.RankOneFails", "max_steps=50", "hydra/launcher=slurm",
                         "hydra.launcher.tasks_per_node=2", "hydra.launcher.max_retries=1",
                         "hydra.launcher.wait=true", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False,
                        timeout=400)
    assert proc.returncode != 0
    assert time.time() - start < 240  # two short attempts, not the 600 s collective timeout
    (run_dir,) = run_dirs(sweep)
    kinds = record_kinds(run_dir)
    assert kinds[:2] == ["submitted", "started"] and kinds.count("started") == 2, kinds
    assert kinds.count("retrying") == 1 and kinds[-1] == "failed", kinds
    state = events.read(run_dir)
    assert state.state is State.FAILED and state.retries == 1 and state.failed_rank == 1
    summary = metrics(run_dir)
    assert summary["status"] == "failed" and "RankOneFails: rank 1 is out" in summary["error"]
    assert summary["failed_rank"] == 1 and summary["restarts"] == 1
