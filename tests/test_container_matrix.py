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
import sys

import pytest

from cli_helpers import run_hpctrain
from isolation import mode_for, ran_as, ran_contained, task_calls
from slurm_helpers import cancel, job_id, metrics, queued, record_kinds, run_dirs, wait_for
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


# 2 ranks on one node; rank 1 blocks forever at step 30 on the first attempt only (tests/test_hang.py's task)
HANG = ["max_steps=60", "ckpt_every=20", "log_every=10", "eval_every=0", "model._target_=user_models.HangsOnce",
        "hang_timeout_s=5", "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "hydra.launcher.max_retries=1",
        "hydra.launcher.wait=true"]


def test_a_rank_that_hangs_in_the_contained_image_is_called_hung_dumped_and_retried(tmp_path):
    """With --contain each `apptainer exec` has a /dev/shm of its own (apptainer/apptainer#3001; bwrap's minimal
    /dev in the stand-in): hpctrain binds the node's into every task, so the watchdog in rank 0's container reads
    rank 1's heartbeat and asks it for its stack. Rank 1 blocking is called hung (rank 1 named, both ranks'
    stacks), retried, and the retry completes."""
    from hpctrain.core import events
    from hpctrain.core.state import EventKind, State

    mode = mode_for("contain", tmp_path)
    sweep, marker = tmp_path / "sweep", tmp_path / "hung-once"
    run_hpctrain(["-m", *HANG, "+model.hang_at=30", f"+model.marker={marker}", f"hydra.sweep.dir={sweep}",
                  *mode.args], cwd=tmp_path, env=mode.env, timeout=500)
    (run_dir,) = run_dirs(sweep)
    assert marker.exists() and ran_as(tmp_path, mode)
    hung = [e.data() for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert hung and hung[0]["ranks"] == [1] and "block_forever" in hung[0]["frame"], hung
    stacks = {p.name: p.read_text() for p in (run_dir / "stacks").glob("*.txt")}
    assert sorted(n.rsplit("-", 1)[-1] for n in stacks) == ["rank0.txt", "rank1.txt"], stacks.keys()
    assert "in block_forever" in next(t for n, t in stacks.items() if n.endswith("rank1.txt"))
    kinds = record_kinds(run_dir)
    assert kinds.count("started") == 2 and kinds.count("retrying") == 1 and kinds[-1] == "completed", kinds
    assert events.read(run_dir).state is State.COMPLETED


DROP_SHM_BIND = """#!{python}
# the container runtime of a site whose tasks cannot share the node's /dev/shm: hpctrain's bind of it dropped
import os, sys
argv, out = sys.argv[1:], []
while argv:
    if argv[:2] == ["--bind", "/dev/shm"]:
        argv = argv[2:]
        continue
    out.append(argv.pop(0))
os.execv({standin!r}, [{standin!r}, *out])
"""


def test_a_task_whose_dev_shm_is_its_own_fails_loudly_instead_of_training_unwatched(tmp_path):
    """The same contained 2-rank run where the tasks cannot share /dev/shm (the bind dropped by a wrapper): the rank
    the watchdog cannot see ends the run `failed` with one line naming the cause and the fix, not retried; it
    never trains on with hang detection silently off for it."""
    from container_helpers import STANDIN

    from hpctrain.core import events

    bin_dir = tmp_path / "container" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "apptainer").write_text(DROP_SHM_BIND.format(python=sys.executable, standin=str(STANDIN)))
    (bin_dir / "apptainer").chmod(0o755)
    mode = mode_for("contain", tmp_path)
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", *HANG, "+model.hang_at=-1", f"hydra.sweep.dir={sweep}", *mode.args], cwd=tmp_path,
                        env=mode.env, timeout=500, check=False)
    (run_dir,) = run_dirs(sweep)
    assert ran_as(tmp_path, mode)
    assert all("/dev/shm" not in call for call in task_calls(tmp_path)), task_calls(tmp_path)
    state = events.read(run_dir)
    assert state.state is not None and state.state.value == "failed", (record_kinds(run_dir), proc.stderr[-2000:])
    assert "UnwatchedError: rank 1: the hang watchdog of this node does not see " in (state.error or ""), state.error
    kinds = record_kinds(run_dir)  # rank 1's own error, and rank 0's fallout as its peer left
    assert kinds[:3] == ["submitted", "started", "failed"] and set(kinds[3:]) <= {"failed"}, kinds
