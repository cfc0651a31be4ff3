"""Slurm paths no other test reaches: a rerun of a partly finished sweep, time limits with retries allowed,
a time-limit requeue that completes, and report on a Slurm sweep. Real jobs on the test cluster."""

import json
import subprocess
import sys

import pytest

from cli_helpers import hpctrain_env, run_hpctrain, skipped
from hpctrain.core import events
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for
from time_limit import matches_uninterrupted, requeue_args, requeued_to_completion

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
    run_hpctrain(requeue_args(b), cwd=tmp_path, timeout=60)
    jobs = [job_id(a), job_id(b)]
    try:
        _timed_out_without_retry(tmp_path, a, jobs[0])
        run_dir = requeued_to_completion(b)
    finally:
        for job in jobs:
            cancel(job)
    matches_uninterrupted(run_dir, tmp_path)  # B's run without interruption, in this process


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
