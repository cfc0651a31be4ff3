"""The container matrix of issue 27, the cases not already parametrized over bare/container elsewhere.

tests/test_slurm.py (a sweep, USR2 requeue bit-exact, also with ``--contain``, the utilisation sampler, max_retries
after a crash), tests/test_preempt_term.py (SIGTERM with the job running, packed, a plain scancel),
tests/test_preemption_real.py (a real preemption from ``urgent`` with a grace time and without, packed without one)
and tests/test_snapshot.py (a held sweep runs its snapshot) run bare and inside the test container
(tests/helpers/isolation.py), which hides Slurm's client and munge socket from the job. Here, in the container:
the time limit (its bare run: tests/test_slurm_paths.py, through the same helper), search workers adopting dead
owners' trials (bare: tests/test_search.py's stale owners), and a search worker scancelled mid-trial then the same
command again (bare: tests/test_search.py's SIGKILLed worker).
"""

import json
import subprocess

import pytest

from cli_helpers import run_hpctrain
from isolation import mode_for, ran_contained
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, wait_for
from test_search import TINY, _stale_trials, owner_step, run_dir_of, running_trial, search, trial_dirs, trials
from time_limit import matches_uninterrupted, requeue_args, requeued_to_completion

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def test_a_time_limit_in_the_container_requeues_and_resumes_bit_exact(tmp_path):
    """timeout_min=1, signal_delay_s=15: submitit's USR2 before the limit, the checkpoint, the requeue
    asked of the host side (no scontrol in the image), and the resumed run ends with the weights of an
    uninterrupted one (the bare run: tests/test_slurm_paths.py, the same helper)."""
    mode = mode_for("container", tmp_path)
    sweep = tmp_path / "sweep"
    run_hpctrain([*requeue_args(sweep), *mode.args], cwd=tmp_path, timeout=60, env=mode.env)
    job = job_id(sweep)
    try:
        run_dir = requeued_to_completion(sweep, timeout=300)
        assert ran_contained(tmp_path)
    finally:
        cancel(job)
    matches_uninterrupted(run_dir, tmp_path)


def test_search_workers_in_the_container_ask_the_queue_on_the_host_and_adopt_dead_owners_trials(tmp_path):
    """Two trials held by Slurm jobs long gone (as the same command run again after its workers were
    scancelled finds them): two workers in the image, which has no squeue, learn from the host side that the
    owners left the queue and adopt both; in the image itself the answer was "unknown" forever."""
    mode = mode_for("container", tmp_path)
    sweep = tmp_path / "sweep"
    _stale_trials(sweep, ["999998", "999999"])
    run_hpctrain(search(sweep, "lr=tag(log,interval(1e-4,1e-1))", "hydra.sweeper.n_trials=4",
                        "hydra.sweeper.n_workers=2", *TINY, "hydra.launcher.wait=true", *mode.args),
                 cwd=tmp_path, env=mode.env, timeout=600)
    found = trials(sweep)
    assert sorted(t.number for t in found) == [0, 1, 2, 3]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in found), [(t.number, t.state) for t in found]
    for t in found[:2]:
        starts = [json.loads(p.read_text())
                  for p in (run_dir_of(sweep, t.number) / ".hpctrain" / "record").glob("*.started.*")]
        assert [s["how"] for s in starts] == ["adopted"], (t.number, starts)
    assert ran_contained(tmp_path)


# trials of over 10 s each (the model sleeps 10 ms a step): a worker can be caught mid-trial, after a checkpoint
MID = ["max_steps=1000", "eval_every=250", "log_every=10", "ckpt_every=50", "data.train_size=1024",
       "data.val_size=128", "model.hidden=16", "model._target_=user_models.SlowDropout", "+model.delay_s=0.01"]


def test_a_search_worker_scancelled_mid_trial_then_the_same_command_again_completes_the_study(tmp_path):
    """Two workers in the image; one is scancelled (SIGTERM, then the end) while it runs a trial; the same
    command again. The trial is adopted (by the other worker, or by the rerun's) and completed from its
    checkpoint, the study ends at n_trials with each trial completed once, and status shows no trial
    cancelled or running (the bare run: tests/test_search.py's SIGKILLed worker)."""
    mode = mode_for("container", tmp_path)
    sweep = tmp_path / "sweep"
    args = search(sweep, "lr=tag(log,interval(1e-4,1e-2))", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_workers=2",
                  "hydra.sweeper.pruner=none", "hydra.sweeper.heartbeat_s=2", "hydra.sweeper.grace_s=20", *MID,
                  *mode.args)
    run_hpctrain(args, cwd=tmp_path, env=mode.env, timeout=60)
    job = job_id(sweep)
    owner = f"{job}_1"
    try:
        wait_for(lambda: owner_step(sweep, owner) >= 60, 600, "worker 1 to be under way with a trial")
        number = running_trial(sweep, owner)
        assert number is not None
        subprocess.run(["scancel", owner], check=True)
        wait_for(lambda: owner not in [line.split()[0] for line in queued(job)], 120, "the cancelled worker to end")
        wait_for(lambda: not queued(job), 900, "the first array to end")
        rerun = run_hpctrain([*args, "hydra.launcher.wait=true"], cwd=tmp_path, env=mode.env, timeout=900,
                             check=False)
        found = trials(sweep)
        assert sorted(t.number for t in found) == [0, 1, 2, 3], rerun.stdout
        assert all(t.state.name == "COMPLETE" for t in found), [(t.number, t.state) for t in found]
        run_dir = run_dir_of(sweep, number)
        starts = [json.loads(p.read_text()) for p in sorted((run_dir / ".hpctrain" / "record").glob("*.started.*"))]
        assert starts[0]["job_id"] == owner and starts[-1]["job_id"] != owner, starts
        assert starts[-1]["how"] == "adopted", starts
        assert metrics(run_dir)["status"] == "completed" and metrics(run_dir)["step"] == 1000
        assert "resumed from" in (run_dir / "hpctrain.log").read_text()
        for d in trial_dirs(sweep):  # each trial ran to its end once: no trial counted twice
            assert record_kinds(d).count("completed") == 1 and record_kinds(d)[-1] == "completed", (d, record_kinds(d))
        status = json.loads(run_hpctrain(["status", str(sweep), "--json"], cwd=tmp_path).stdout)
        assert {r["idx"]: r["state"] for r in status["runs"]} == {n: "completed" for n in range(4)}, status["runs"]
        assert ran_contained(tmp_path)
    finally:
        cancel(job)
