"""Slurm paths no other test reaches: a rerun of a partly finished sweep, time limits with retries allowed,
a time-limit requeue that completes, and report on a Slurm sweep. Real jobs on the test cluster."""

import json
import re
import subprocess
import sys

import pytest
import torch

from cli_helpers import hpctrain_env, run_hpctrain, skipped
from hpctrain.core import events
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for
from trainer_helpers import compose, state_close

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_rerun_submits_only_the_unfinished_runs_and_report_reads_the_sweep(tmp_path):
    """Runs 2 and 3 fail on their first attempt only (max_retries=0); the same command again submits an
    array of two tasks, indices 0 and 1, which are runs 2 and 3; report then ranks all four."""
    sweep, m1, m2 = tmp_path / "sweep", tmp_path / "m1", tmp_path / "m2"
    m1.mkdir(), m2.mkdir()
    args = ["-m", "model._target_=user_models.TinyNet,user_models.Flaky", f"+model.marker_dir={m1},{m2}",
            "max_steps=20", "hydra/launcher=slurm", "hydra.launcher.max_retries=0", "hydra.launcher.wait=true",
            f"hydra.sweep.dir={sweep}"]
    first = run_hpctrain(args, cwd=tmp_path, timeout=300, check=False)
    assert first.returncode != 0, first.stdout + first.stderr
    dirs = run_dirs(sweep)
    assert [metrics(d)["status"] for d in dirs] == ["completed", "completed", "failed", "failed"]
    before = [record_kinds(d) for d in dirs[:2]]

    again = run_hpctrain(args, cwd=tmp_path, timeout=300)
    assert f"skipped 2 run(s), already completed by the same code: {dirs[0].name}, {dirs[1].name}" in \
        skipped(again.stdout), again.stdout
    submission = json.loads((sweep / "sweep.json").read_text())["submissions"][-1]
    assert submission["runs"] == [2, 3]
    (array,) = submission["job_ids"]
    assert [metrics(d)["status"] for d in dirs] == ["completed"] * 4
    # array index != run index: task 0 ran run 2, task 1 ran run 3
    assert [events.read(d).job_id for d in dirs[2:]] == [f"{array}_0", f"{array}_1"]
    assert [record_kinds(d) for d in dirs[:2]] == before  # the completed runs were not touched

    report = subprocess.run([sys.executable, "-m", "hpctrain", "report", str(sweep)], cwd=tmp_path,
                            env=hpctrain_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    results = json.loads((sweep / "results.json").read_text())
    assert sorted(r["idx"] for r in results["runs"]) == [0, 1, 2, 3]
    truth = {i: metrics(d)["metrics"]["val/loss"] for i, d in enumerate(dirs)}
    assert results["best"]["idx"] == min(truth, key=truth.get)
    assert results["best"]["value"] == truth[results["best"]["idx"]]


SLOW = ["max_steps=2500", "log_every=50", "eval_every=0", "ckpt_every=0", "model._target_=user_models.SlowDropout"]


def test_time_limits_end_a_run_as_timeout_or_requeue_it_to_completion(tmp_path):
    """Two sweeps under a 1-minute limit at once (each waits for Slurm's limit: together, the wait is paid
    once).

    A: max_retries=2 but max_num_timeout=0: the time limit ends the run as timeout, with no retry; status
    says timeout from accounting (sacct), and from the task's log alone when sacct fails.
    B: over 50 s of training (USR2 comes 15 to 45 s in: slurmctld checks time limits every 30 s and signals
    early enough for that): checkpoint, requeue, resume at the checkpoint's step, completion with the
    weights of an uninterrupted run. Its model sleeps in its first attempt only.
    """
    a, b = tmp_path / "a", tmp_path / "b"
    run_hpctrain(["-m", "max_steps=1000000", "hydra/launcher=slurm", "hydra.launcher.timeout_min=1",
                  "hydra.launcher.signal_delay_s=5", "hydra.launcher.max_num_timeout=0",
                  "hydra.launcher.max_retries=2", f"hydra.sweep.dir={a}"], cwd=tmp_path, timeout=60)
    run_hpctrain(["-m", *SLOW, "+model.delay_s=0.02", "+model.first_attempt_only=true", "hydra/launcher=slurm",
                  "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=15", "hydra.launcher.max_num_timeout=8",
                  f"hydra.sweep.dir={b}"], cwd=tmp_path, timeout=60)
    jobs = [job_id(a), job_id(b)]
    try:
        _timed_out_without_retry(tmp_path, a, jobs[0])
        run_dir = _requeued_to_completion(b)
    finally:
        for job in jobs:
            cancel(job)
    # B's run without interruption (no sleep: the delay changes no number), in this process
    from hpctrain.train.distributed import DistInfo
    from hpctrain.train.trainer import Trainer

    reference = Trainer(compose(SLOW + ["+model.delay_s=0"]), tmp_path / "reference", DistInfo())
    reference.fit()
    done = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert done["step"] == 2500
    assert state_close(done["model"], reference.raw_model.state_dict(), atol=0)


def _timed_out_without_retry(tmp_path, sweep, job: str) -> None:
    wait_for(lambda: not queued(job), 300, "the job to time out and leave the queue", every=2)
    (run_dir,) = run_dirs(sweep)
    kinds = record_kinds(run_dir)
    assert kinds.count("started") == 1 and "retrying" not in kinds, kinds
    for sacct in ("real", "failing"):
        env = hpctrain_env()
        if sacct == "failing":  # as on a cluster whose accounting does not answer
            bin_dir = tmp_path / "no-sacct"
            bin_dir.mkdir()
            (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Problem talking to the database' >&2\n"
                                           "exit 1\n")
            (bin_dir / "sacct").chmod(0o755)
            env["PATH"] = f"{bin_dir}:{env['PATH']}"
        proc = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(sweep), "--json"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        (row,) = json.loads(proc.stdout)["runs"]
        assert row["state"] == "timeout" and row["restarts"] == 0, (sacct, row)


def _requeued_to_completion(sweep):
    wait_for(lambda: len(run_dirs(sweep)) == 1, 120, "the run to start")
    (run_dir,) = run_dirs(sweep)
    wait_for(lambda: metrics(run_dir).get("status") in ("completed", "failed", "timeout"), 540,
             "the run to end", every=2)
    assert metrics(run_dir)["status"] == "completed", metrics(run_dir)
    kinds = record_kinds(run_dir)
    assert kinds.count("requeued") >= 1 and kinds[-1] == "completed", kinds
    resumed = [int(n) for n in re.findall(r"resumed from \S+ at step (\d+)", (run_dir / "hpctrain.log").read_text())]
    assert resumed and 0 < resumed[0] < 2500, resumed  # the step it checkpointed at on USR2
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*_log.*"))
    assert "this job is timed-out" in logs and "remaining timeouts" in logs  # submitit's requeue
    return run_dir
