"""The run record against the real test cluster: a signal during the final save, a node that fails."""

import subprocess

import pytest

from cli_helpers import run_hpctrain, status_runs
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def status(sweep, cwd) -> list:
    return status_runs(sweep, cwd)


def test_usr2_during_the_final_save_ends_completed_and_is_not_retrained(tmp_path):
    sweep, marker = tmp_path / "sweep", tmp_path / "saving"
    run_hpctrain(["-m", "max_steps=40", "log_every=10", "eval_every=0", "ckpt_every=0",
                  "model._target_=user_models.SlowSave", f"+model.marker={marker}", "+model.delay_s=20",
                  "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=120)
    job = job_id(sweep)
    try:
        wait_for(marker.exists, 240, "the final save to begin")
        subprocess.run(["scancel", "--signal=USR2", "--full", job], check=True)  # one run: not an array
        wait_for(lambda: not queued(job), 180, "the job to leave the queue")
        (run_dir,) = run_dirs(sweep)
        assert record_kinds(run_dir) == ["submitted", "started", "completed"], record_kinds(run_dir)
        done = metrics(run_dir)
        assert done["status"] == "completed" and done["step"] == 40 and "train/loss" in done["metrics"]
        (row,) = status(sweep, tmp_path)
        assert row["state"] == "completed" and row["restarts"] == 0
    finally:
        cancel(job)


def _jobs_on(node: str) -> list:
    out = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i"], capture_output=True, text=True, timeout=30).stdout
    return out.split()


def test_a_node_failure_requeue_shows_slurm_state_and_reason(tmp_path):
    """A run pinned to n2 (requeue allowed); n2 goes down under it: Slurm requeues the job, which waits
    (held, or pending for the node) with no word in the record: status says so with Slurm's reason, not
    plain queued. The node is drained first so no other job is killed, and resumed whatever happens."""
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=1000000", "log_every=10", "hydra/launcher=slurm",
                  "+hydra.launcher.additional_parameters.nodelist=n2", f"hydra.sweep.dir={sweep}"],
                 cwd=tmp_path, timeout=120)
    job = job_id(sweep)
    touched = False
    try:
        wait_for(lambda: len(run_dirs(sweep)) == 1 and (metrics(run_dirs(sweep)[0]).get("step") or 0) >= 10, 300,
                 "the run to be under way on n2")
        touched = True
        subprocess.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=hpctrain-test"], check=True)
        wait_for(lambda: [j.split("_")[0] for j in _jobs_on("n2")] == [job], 300, "n2 to hold this job only")
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=test"], check=True)
        wait_for(lambda: any(" RUNNING" not in line for line in queued(job)) or not queued(job), 120,
                 "the job to be requeued")
        line = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i|%T|%r"], capture_output=True,
                              text=True).stdout.strip()
        assert line, "the job left the queue: Slurm did not requeue it"
        (row,) = status(sweep, tmp_path)
        assert row["state"] in ("held", "requeued"), (row, line)  # not plain "queued"
        said = "held by Slurm (" if row["state"] == "held" else "requeued by Slurm (a node failure"
        assert row["note"].startswith(said) and row["note"].split(")")[-1].strip(": "), (row, line)  # the reason
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], check=True)
        subprocess.run(["scontrol", "release", job], capture_output=True)  # a held job waits for it
        wait_for(lambda: record_kinds(run_dirs(sweep)[0]).count("started") == 2, 240, "the run to start again")
        (row,) = status(sweep, tmp_path)
        assert row["state"] == "running" and row["restarts"] == 1, row  # Slurm's requeue counts as a restart
    finally:
        if touched:
            subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)
        cancel(job)
        if touched:
            subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)
