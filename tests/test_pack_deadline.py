"""A packed task's wait for its runs' checkpoints has a deadline from signal_delay_s (issue 19, item 13).

One slow run must not cost the whole task its requeue: a run still saving when the deadline passes is
killed, recorded requeued, named in the job's log, and resumes from its last complete checkpoint.
"""

import json
import subprocess

import pytest

from cli_helpers import run_hpctrain
from hpctrain.job import pack
from slurm_helpers import metrics, record_kinds, run_dirs, wait_for


def test_the_wait_is_signal_delay_less_a_margin_for_the_requeue():
    assert pack.checkpoint_wait_s(90) == 90 - pack.REQUEUE_MARGIN_S
    assert pack.checkpoint_wait_s(20) == 10  # the margin is at most half the delay
    assert pack.checkpoint_wait_s(4) == 2
    assert pack.checkpoint_wait_s(0) == 0


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_run_slow_to_checkpoint_is_cut_short_and_the_task_still_requeues(tmp_path):
    sweep, marker = tmp_path / "sweep", tmp_path / "slow-from-now"
    run_hpctrain(["-m", "model._target_=user_models.SlowDropout,stop_models.SlowToCheckpoint",
                  f"+model.marker={marker}", "+model.delay_s=0.005", "+model.first_attempt_only=true",
                  "max_steps=3000", "log_every=20", "eval_every=0", "ckpt_every=50",
                  "hydra/launcher=slurm", "hydra.launcher.runs_per_task=2", "hydra.launcher.cpus_per_task=2",
                  "hydra.launcher.signal_delay_s=20", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=120)
    manifest = json.loads((sweep / "sweep.json").read_text())
    job = manifest["runs"]["0"]["job_id"]
    try:
        wait_for(lambda: len(run_dirs(sweep)) == 2 and all(metrics(d).get("step", 0) >= 120 for d in run_dirs(sweep)),
                 240, "both packed runs past their second checkpoint")
        fast, slow = run_dirs(sweep)
        marker.write_text("")  # from now on the slow run's checkpoint takes 600 s
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        wait_for(lambda: all("requeued" in record_kinds(d) for d in (fast, slow)), 60, "both runs recorded requeued")
        wait_for(lambda: all(metrics(d).get("status") == "completed" for d in (fast, slow)), 420, "both to complete")
        for d in (fast, slow):
            kinds = record_kinds(d)
            assert kinds.count("started") == 2 and "requeued" in kinds, kinds
            assert "resumed from" in (d / "hpctrain.log").read_text()
            assert metrics(d)["step"] == 3000
        cut = f"#1 {slow.name} cut short: not checkpointed 10 s after"
        assert cut in (slow / ".hpctrain" / "task.log").read_text()
        logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.out"))
        assert cut in logs and "it resumes from its last complete checkpoint" in logs
        assert "cut short" not in (fast / ".hpctrain" / "task.log").read_text()
    finally:
        subprocess.run(["scancel", job.split("_")[0]], capture_output=True)
