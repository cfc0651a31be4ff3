"""A hung run is ended within its allowance, its stacks dumped, recorded `hung` and retried from its checkpoint
(issue 30): the watchdog process, the heartbeats, the allowances, the record."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli_helpers import hpctrain_env, run_hpctrain
from hpctrain.core import events
from hpctrain.core.state import EventKind, State
from hpctrain.job import heartbeat, watchdog
from hpctrain.job.heartbeat import Phase
from slurm_helpers import metrics, record_kinds, run_dirs

TASK = ["max_steps=60", "ckpt_every=20", "log_every=10", "eval_every=0", "model._target_=user_models.HangsOnce"]


def final_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_weights_of_a_run_that_never_hung(run_dir: Path, ref: Path, common: list, cwd: Path, timeout: int) -> None:
    """The retried run ends with the weights of the same run (``common``) that never hung."""
    run_hpctrain(["-m", *TASK, *common, f"hydra.sweep.dir={ref}"], cwd=cwd, timeout=timeout)
    (ref_dir,) = run_dirs(ref)
    mine, theirs = final_weights(run_dir), final_weights(ref_dir)
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def study_of(sweep: Path):
    """The sweep's Optuna study, read from its journal."""
    import optuna

    return optuna.load_study(study_name="search", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(sweep / ".hpctrain" / "study.journal"))))


def stacks_of(run_dir: Path) -> dict:
    return {p.name: p.read_text() for p in sorted((run_dir / "stacks").glob("*.txt"))}


def test_a_hung_rank_is_ended_dumped_and_retried_to_the_same_weights_on_local(tmp_path):
    """Rank 1 of 2 blocks forever at step 30 on its first attempt: called hung within hang_timeout_s + 30 s,
    both ranks' stacks in the run dir (rank 1's names the blocking frame), retried from the step-20
    checkpoint to the weights of a run that never hung."""
    sweep, ref = tmp_path / "sweep", tmp_path / "ref"
    marker = tmp_path / "hung-once"
    common = ["hydra/launcher=local", "hydra.launcher.tasks_per_node=2", "hang_timeout_s=5"]
    started = time.time()
    proc = run_hpctrain(["-m", *TASK, "+model.hang_at=30", f"+model.marker={marker}", *common,
                         "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300)
    (run_dir,) = run_dirs(sweep)
    assert marker.exists()
    hung = [e for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert hung, record_kinds(run_dir)
    detail = hung[0].data()
    # detected within the allowance and the slack the issue gives (the marker is written as rank 1 blocks)
    assert hung[0].time_ns / 1e9 - marker.stat().st_mtime < 5 + 30, detail
    assert detail["ranks"] == [1] and detail["step"] == 30 and "block_forever" in detail["frame"], detail
    assert "hung at step 30" in detail["error"] and "rank 1 on" in detail["error"], detail
    stacks = stacks_of(run_dir)
    assert sorted(n.rsplit("-", 1)[-1] for n in stacks) == ["rank0.txt", "rank1.txt"], stacks.keys()
    rank1 = next(t for n, t in stacks.items() if n.endswith("rank1.txt"))
    assert "in block_forever" in rank1 and "user_models.py" in rank1, rank1
    kinds = record_kinds(run_dir)
    assert kinds.count("started") == 2 and kinds.count("retrying") == 1 and kinds[-1] == "completed", kinds
    state = events.read(run_dir)
    assert state.state is State.COMPLETED and state.retries == 1
    assert time.time() - started < 240, "the hang was not ended within minutes"
    print(proc.stderr[-2000:])

    run_hpctrain(["-m", *TASK, *common, f"hydra.sweep.dir={ref}"], cwd=tmp_path, timeout=300)
    (ref_dir,) = run_dirs(ref)
    mine, theirs = final_weights(run_dir), final_weights(ref_dir)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


def test_a_long_first_step_and_eval_are_not_a_hang_but_a_stall_in_training_is(tmp_path):
    """With a train allowance of 2 s: a first step of 8 s and an eval of 8 s are within their own allowances
    (completed, no hung), while an 8 s stall at step 30 of the same run is a hang (recorded hung, not retried:
    max_retries=0)."""
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "max_steps=40", "eval_every=20", "log_every=10", "model._target_=user_models.HangsOnce",
                  "+model.hang_at=-1,30", "+model.slow_first_s=8", "+model.slow_eval_s=8", "+model.hang_rank=0",
                  "+model.pause_s=8", f"+model.marker={tmp_path / 'stalled'}", "hang_timeout_s=2",
                  "hydra/launcher=local", "hydra.launcher.max_parallel=2", "hydra.launcher.max_retries=0",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=300, check=False)
    slow, stalled = run_dirs(sweep)
    assert "hang_at=-1" in slow.name and "hang_at=30" in stalled.name
    assert metrics(slow).get("status") == "completed", record_kinds(slow)
    assert "hung" not in record_kinds(slow)
    assert metrics(stalled).get("status") == "hung", record_kinds(stalled)
    line = metrics(stalled)["error"]
    assert line.startswith("hung at step 30 (train)") and "\n" not in line, line
    # status, report and the API show the state and its one line
    shown = run_hpctrain(["status", str(sweep)], cwd=tmp_path, check=False, env={"COLUMNS": "300"}).stdout
    assert "1 hung" in shown and f"#1 hung: {line}" in " ".join(shown.split()), shown
    report = run_hpctrain(["report", str(sweep)], cwd=tmp_path, check=False, env={"COLUMNS": "300"}).stdout
    assert " hung (log:" in report and line in " ".join(report.split()), report
    import hpctrain

    run = hpctrain.load(sweep).runs[1]
    assert run.state is State.HUNG and run.error == line
    from hpctrain.review.tensorboard_plugin import data as tab

    shown_in_tab = tab.payload(sweep, tab.TailCache())
    assert shown_in_tab["counts"].get("hung") == 1
    assert [(f["idx"], f["state"], f["error"]) for f in shown_in_tab["failed"]] == [(1, "hung", line)]


def test_a_rank_stuck_in_setup_is_ended_dumped_and_retried_on_local(tmp_path):
    """Rank 1 of 2 blocks forever in its model's constructor (before the Trainer exists, while rank 0 waits for
    it in DDP's first collective) on its first attempt: called hung in the setup phase within hang_setup_s
    (20 s: imports on a loaded machine take seconds, and nothing in setup marks progress), both ranks' stacks dumped (rank 1's names the blocking frame), retried, and the retry completes."""
    sweep, marker = tmp_path / "sweep", tmp_path / "blocked-once"
    started = time.time()
    run_hpctrain(["-m", "max_steps=20", "log_every=10", "eval_every=0", "model._target_=user_models.BlocksInInit",
                  f"+model.marker={marker}", "hang_setup_s=20", "hydra/launcher=local",
                  "hydra.launcher.tasks_per_node=2", "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"],
                 cwd=tmp_path, timeout=300)
    (run_dir,) = run_dirs(sweep)
    assert marker.exists()
    hung = [e for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert hung, record_kinds(run_dir)
    detail = hung[0].data()
    assert hung[0].time_ns / 1e9 - marker.stat().st_mtime < 20 + 30, detail
    assert detail["phase"] == "setup" and detail["ranks"] == [1] and "block_forever" in detail["frame"], detail
    assert detail["error"].startswith("hung in setup, before training: no progress for "), detail
    assert "(allowance 20 s); rank 1 on" in detail["error"], detail
    stacks = stacks_of(run_dir)
    assert sorted(n.rsplit("-", 1)[-1] for n in stacks) == ["rank0.txt", "rank1.txt"], stacks.keys()
    rank1 = next(t for n, t in stacks.items() if n.endswith("rank1.txt"))
    assert "in block_forever" in rank1 and "in __init__" in rank1 and "phase setup" in rank1, rank1
    kinds = record_kinds(run_dir)
    assert kinds.count("started") == 2 and kinds.count("retrying") == 1 and kinds[-1] == "completed", kinds
    assert events.read(run_dir).state is State.COMPLETED
    assert time.time() - started < 240


def test_hang_setup_s_is_checked_on_the_login_node(tmp_path):
    for value in ("0", "-3"):
        proc = run_hpctrain(["-m", "max_steps=5", f"hang_setup_s={value}", "hydra/launcher=local",
                             f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, check=False, timeout=120)
        assert proc.returncode != 0
        assert "hang_setup_s" in proc.stderr and "a number of seconds > 0 (unset: hang_first_step_s)" in proc.stderr, \
            proc.stderr[-2000:]
        assert not (tmp_path / "sweep").exists()
    shown = run_hpctrain(["--help"], cwd=tmp_path).stdout
    assert "hang_setup_s" in shown


def _direct_hang(proc: "subprocess.CompletedProcess[str]", run_dir: Path, rank: int) -> str:
    """What a run without a launcher left after its hang: a non-zero exit, the record `hung`, the stacks, and
    the one line on stderr (returned)."""
    assert proc.returncode != 0, proc.stderr[-3000:]
    state = events.read(run_dir)
    assert state.state is State.HUNG, record_kinds(run_dir)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpctrain: hung")]
    assert len(lines) == 1, proc.stderr[-3000:]
    (line,) = lines
    assert line.startswith("hpctrain: hung at step 30 (train): no progress for "), line
    assert f"rank {rank} on " in line and " in block_forever (user_models.py:" in line, line
    assert line.endswith(f"; stacks in {run_dir.absolute() / 'stacks'}/"), line
    stacks = stacks_of(run_dir)
    mine = [t for n, t in stacks.items() if n.endswith(f"rank{rank}.txt")]
    assert mine and "in block_forever" in mine[0], stacks.keys()
    return line


def test_a_plain_run_without_a_launcher_that_hangs_is_ended_with_its_stacks(tmp_path):
    """`python -m hpctrain` in run mode (one process, nothing to retry it): a hang at step 30 ends the command
    non-zero within minutes, the record `hung`, the stack in the run dir, one line on stderr saying where."""
    run_dir = tmp_path / "run"
    started = time.time()
    proc = run_hpctrain([*TASK, "+model.hang_at=30", "+model.hang_rank=0", f"+model.marker={tmp_path / 'once'}",
                         "hang_timeout_s=5", f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=180, check=False)
    _direct_hang(proc, run_dir, 0)
    assert time.time() - started < 150


def test_a_torchrun_run_that_hangs_is_ended_with_both_ranks_stacks(tmp_path):
    """torchrun, 2 ranks over gloo, no launcher: rank 1 blocks at step 30; the watchdog local rank 0 started
    ends both (torchrun exits non-zero), records `hung` naming rank 1, dumps both ranks' stacks."""

    run_dir = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "hpctrain", *TASK,
                           "+model.hang_at=30", f"+model.marker={tmp_path / 'once'}", "hang_timeout_s=5",
                           f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=240)
    _direct_hang(proc, run_dir, 1)
    detail = next(e.data() for e in events.events(run_dir) if e.kind is EventKind.HUNG)
    assert detail["ranks"] == [1], detail
    assert sorted(n.rsplit("-", 1)[-1] for n in stacks_of(run_dir)) == ["rank0.txt", "rank1.txt"]


# ---------------------------------------------------------------- the watchdog's allowances, without processes
def beat_file(directory: Path, rank: int) -> heartbeat.Heart:
    return heartbeat.Heart(directory, rank, rank)


def test_the_train_allowance_is_derived_from_the_measured_step_time_with_a_floor(tmp_path):
    heart = beat_file(tmp_path, 0)
    try:
        dog = watchdog.Watchdog(watchdog.WatchSettings(str(tmp_path), str(tmp_path), os.getpid()))
        heart.phase(Phase.TRAIN)
        t = 0.0
        for step in range(10):
            heart.slots[heartbeat.STEP] = step
            assert dog.look(t) == []
            t += 2.0 if step < watchdog.WARMUP_STEPS + 1 else 50.0  # 50 s steps after warm-up
        assert dog.train_allowance() == watchdog.HANG_FACTOR * 50.0
        (w,) = dog.watches.values()
        assert dog.allowance(w) == 500.0
        seen = w.changed_at  # the last step's
        assert dog.look(seen + 499) == [] and len(dog.look(seen + 501)) == 1  # no step for longer: hung
        heart.phase(Phase.EVAL)  # a phase change is progress, and the eval's allowance then holds
        assert dog.look(seen + 502) == [] and dog.allowance(w) == 1800.0
        fast = watchdog.Watchdog(watchdog.WatchSettings(str(tmp_path), str(tmp_path), os.getpid()))
        assert fast.train_allowance() == watchdog.HANG_FLOOR_S  # never below the floor
        fixed = watchdog.Watchdog(watchdog.WatchSettings(str(tmp_path), str(tmp_path), os.getpid(), timeout_s=7))
        assert fixed.train_allowance() == 7  # an explicit value overrides the derived one
    finally:
        heart.close()


def test_a_resumed_run_warms_up_again_under_the_first_step_allowance(tmp_path):
    """A run resumed at step 20 (its checkpoint): its first steps there (a compile again) have the first step's
    allowance, not the train allowance, however far its step jumped from the start."""
    heart = beat_file(tmp_path, 0)
    try:
        dog = watchdog.Watchdog(watchdog.WatchSettings(str(tmp_path), str(tmp_path), os.getpid(), timeout_s=5))
        assert dog.look(0.0) == []  # starting: step -1
        heart.slots[heartbeat.STEP] = heart.slots[heartbeat.START] = 20
        heart.phase(Phase.TRAIN)
        assert dog.look(1.0) == []
        heart.slots[heartbeat.STEP] = 21
        assert dog.look(2.0) == []
        assert dog.look(100.0) == []  # 98 s on step 21: warm-up, allowed 1800 s
        for step in range(22, 26):
            heart.slots[heartbeat.STEP] = step
            assert dog.look(100.0 + step) == []
        assert len(dog.look(125.0 + 6)) == 1  # past warm-up: 5 s
    finally:
        heart.close()


def test_setup_has_its_own_allowance_by_default_the_first_steps(tmp_path):
    """A rank's heartbeat starts in setup (before the process group, the model and the data): hung after
    hang_setup_s there, which is hang_first_step_s when unset."""
    heart = beat_file(tmp_path, 0)
    try:
        assert heartbeat.read(heart.path).phase is Phase.SETUP
        default = watchdog.settings_of({"hang_first_step_s": 40}, tmp_path, tmp_path, "1")
        assert default is not None and default.setup_allowance == 40
        own = watchdog.settings_of({"hang_setup_s": 7, "hang_timeout_s": 100}, tmp_path, tmp_path, "1")
        assert own is not None and own.setup_allowance == 7
        dog = watchdog.Watchdog(own)
        assert dog.look(0.0) == [] and dog.look(6.5) == [] and len(dog.look(7.5)) == 1
    finally:
        heart.close()


def test_a_rank_whose_heartbeat_dir_its_watchdog_does_not_read_fails_loudly(tmp_path, monkeypatch):
    """A heartbeat dir without the marker its node's watchdog starter writes (a task with a /dev/shm of its own):
    the rank stops with one line saying so and what to do, and a retry would not help (deterministic)."""
    from hpctrain.core.errors import deterministic

    monkeypatch.setenv(heartbeat.DIR_ENV, str(tmp_path / "beats"))
    heart = heartbeat.for_this_rank(1, 1)
    try:
        assert heartbeat.for_this_rank(1, 1) is heart  # the trainer goes on with the app's heartbeat
        with pytest.raises(heartbeat.UnwatchedError, match=r"^rank 1: the hang watchdog of this node does not see ") \
                as raised:
            heart.check_watched()
        assert "bind the host's /dev/shm" in str(raised.value) and "hang_timeout_s=0" in str(raised.value)
        assert deterministic(f"Traceback ...\nhpctrain.job.heartbeat.UnwatchedError: {raised.value}")
        heartbeat.mark_watched(tmp_path / "beats")
        heart.check_watched()
    finally:
        heart.close()
    assert heartbeat.for_this_rank(1, 1) is not heart  # closed: the next run of the process has its own
    heartbeat.for_this_rank(1, 1).close()


def test_hang_timeout_zero_turns_the_watchdog_off(tmp_path):
    assert watchdog.settings_of({"hang_timeout_s": 0}, tmp_path, tmp_path, "1") is None
    on = watchdog.settings_of({}, tmp_path, tmp_path, "1")
    assert on is not None and on.timeout_s is None and on.first_step_s == 1800


def test_hung_is_its_own_state_retried_within_max_retries(tmp_path):
    from hpctrain.job.lifecycle import Lifecycle, Outcome

    events.submitted(tmp_path)
    events.started(tmp_path)
    events.failed(tmp_path, "RuntimeError: Connection closed by peer", rank=0)  # the fallout of the kill
    Lifecycle(tmp_path, rank=1).end(Outcome.HUNG, error="hung at step 30 (train): ...", event={"nodes": ["n1"]})
    state = events.read(tmp_path)
    assert state.state is State.HUNG and state.error.startswith("hung at step 30") and state.failed_rank == 1
    assert events.retry_allowed(tmp_path, 1) == 1
    assert events.retry_allowed(tmp_path, 0) is None


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_hung_rank_on_slurm_is_retried_away_from_its_node_to_the_same_weights(tmp_path):
    """The same hang in a Slurm job (one node, two tasks): hung, stacks of both ranks, requeued with the node
    it hung on in the job's excluded nodes, and completed elsewhere with the weights of a run that never hung."""
    import subprocess

    from slurm_helpers import job_id

    sweep, ref = tmp_path / "sweep", tmp_path / "ref"
    marker = tmp_path / "hung-once"
    common = ["hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "hang_timeout_s=5", "hydra.launcher.wait=true"]
    run_hpctrain(["-m", *TASK, "+model.hang_at=30", f"+model.marker={marker}", *common,
                  "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=500)
    (run_dir,) = run_dirs(sweep)
    hung = [e.data() for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert hung and hung[0]["ranks"] == [1] and "block_forever" in hung[0]["frame"], hung
    (node,) = hung[0]["nodes"]
    assert {n.rsplit("-", 1)[-1] for n in stacks_of(run_dir)} == {"rank0.txt", "rank1.txt"}
    retry = [e.data() for e in events.events(run_dir) if e.kind is EventKind.RETRYING]
    assert retry and retry[0]["avoid_nodes"] == [node], retry
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id(sweep)], capture_output=True, text=True).stdout
    assert f"ExcNodeList={node}" in shown, shown
    assert record_kinds(run_dir).count("started") == 2
    assert events.read(run_dir).state is State.COMPLETED

    assert_weights_of_a_run_that_never_hung(run_dir, ref, common, tmp_path, timeout=500)


def test_a_hang_inside_a_packed_run_ends_that_run_only(tmp_path):
    """Two runs packed in one task (runs_per_task=2): the one that hangs is ended hung and retried; its sibling
    runs on to completed once, never started again."""
    sweep = tmp_path / "sweep"
    marker = tmp_path / "hung-once"
    run_hpctrain(["-m", *TASK, "+model.hang_at=-1,30", "+model.hang_rank=0", f"+model.marker={marker}",
                  "hang_timeout_s=5", "hydra/launcher=local", "hydra.launcher.runs_per_task=2",
                  "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=400)
    sibling, hung_run = run_dirs(sweep)
    assert "hang_at=30" in hung_run.name and marker.exists()
    kinds = record_kinds(hung_run)
    assert "hung" in kinds and kinds.count("started") == 2 and kinds[-1] == "completed", kinds
    assert record_kinds(sibling) == ["submitted", "started", "completed"], record_kinds(sibling)
    assert any("block_forever" in t for t in stacks_of(hung_run).values())


def test_a_search_trial_that_hangs_is_retried_and_the_study_reaches_n_trials(tmp_path):
    """A trial of a local search hangs once (rank 0, step 30): its worker ends it (the process lives on), the
    trial is released and resumed from its checkpoint; the study ends with n_trials trials, none counted twice."""
    import optuna

    sweep = tmp_path / "sweep"
    marker = tmp_path / "hung-once"
    run_hpctrain(["-m", "hydra/sweeper=search", "hydra/launcher=local", f"hydra.sweep.dir={sweep}",
                  "lr=tag(log,interval(1e-3,1e-2))", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_workers=1",
                  "hydra.sweeper.pruner=none", "hydra.launcher.max_retries=1", *TASK, "+model.hang_at=30",
                  "+model.hang_rank=0", f"+model.marker={marker}", "hang_timeout_s=5"], cwd=tmp_path, timeout=500)
    assert marker.exists()
    study = study_of(sweep)
    found = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in found) == [0, 1, 2]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in found), [t.state for t in found]
    dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.startswith("trial-"))
    assert len(dirs) == 3
    hung = [d for d in dirs if "hung" in record_kinds(d)]
    assert len(hung) == 1, [record_kinds(d) for d in dirs]
    kinds = record_kinds(hung[0])
    assert kinds.count("retrying") == 1 and kinds[-1] == "completed", kinds
    assert any("block_forever" in t for t in stacks_of(hung[0]).values())
    # its worker ended the trial and went on: one worker job, never retried itself
    assert len(list((sweep / ".submitit").glob("*_log.out"))) == 1


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_search_trial_over_two_nodes_that_hangs_is_one_decision_and_the_same_command_completes_it(tmp_path):
    """A search worker over both nodes (one rank a node): rank 1 blocks at step 30 in the trial's first attempt.
    The nodes' watchdogs make one decision (one `hung`, naming rank 1 and its node), as a plain run's do, and end
    the worker's ranks (a collective cannot be left); the worker's task is not requeued, and the same command
    again adopts the trial and completes the study."""
    import optuna

    sweep = tmp_path / "sweep"
    marker = tmp_path / "hung-once"
    command = ["-m", "hydra/sweeper=search", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
               "lr=tag(log,interval(1e-3,1e-2))", "hydra.sweeper.n_trials=1", "hydra.sweeper.n_workers=1",
               "hydra.sweeper.pruner=none", "hydra.launcher.max_retries=1", "hydra.launcher.nodes=2",
               "hydra.launcher.tasks_per_node=1", "hydra.launcher.wait=true", *TASK, "+model.hang_at=30",
               "+model.hang_rank=1", f"+model.marker={marker}", "hang_timeout_s=5"]
    run_hpctrain(command, cwd=tmp_path, timeout=500)
    assert marker.exists()
    (trial_dir,) = [p for p in sweep.iterdir() if p.is_dir() and p.name.startswith("trial-")]
    hung = [e.data() for e in events.events(trial_dir) if e.kind is EventKind.HUNG]
    assert len(hung) == 1, hung  # one decision, not one a node
    assert hung[0]["ranks"] == [1] and hung[0]["nodes_reported"] == ["n1", "n2"], hung[0]
    assert hung[0]["nodes"] == [hung[0]["error"].split(" on ", 1)[1].split(" ", 1)[0]], hung[0]

    run_hpctrain(command, cwd=tmp_path, timeout=500)  # the same command again: the trial adopted and completed
    study = study_of(sweep)
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.state == optuna.trial.TrialState.COMPLETE, trial.state
    assert events.read(trial_dir).state is State.COMPLETED, record_kinds(trial_dir)
    assert [e.kind for e in events.events(trial_dir)].count(EventKind.HUNG) == 1


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_hang_over_two_nodes_is_one_decision_naming_the_rank_and_node_and_the_retry_can_still_run(tmp_path):
    """Rank 1 of a run over both nodes (one rank a node) blocks at step 30 on its first attempt: each node's watchdog
    dumps its own rank, one `hung` names rank 1 and its node (rank 0 only waits in the collective), and the retry
    is not kept off that node (on this 2-node partition a 2-node job could then never start again: Slurm keeps it
    pending, BadConstraints), saying so; it completes with the weights of a run over two nodes that never hung."""
    import subprocess

    from slurm_helpers import job_id

    sweep, ref = tmp_path / "sweep", tmp_path / "ref"
    marker = tmp_path / "hung-once"
    common = ["hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1", "hang_timeout_s=5",
              "hydra.launcher.wait=true"]
    run_hpctrain(["-m", *TASK, "+model.hang_at=30", f"+model.marker={marker}", *common,
                  "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=400)
    (run_dir,) = run_dirs(sweep)
    hung = [e for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert len(hung) == 1, [e.data() for e in hung]  # one decision, not one a node
    detail = hung[0].data()
    assert hung[0].time_ns / 1e9 - marker.stat().st_mtime < 5 + 30, detail
    stacks = stacks_of(run_dir)
    assert sorted(n.rsplit("-", 1)[-1] for n in stacks) == ["rank0.txt", "rank1.txt"], stacks.keys()
    # each rank's stack dumped by its own node's watchdog, named by its node
    on = {n.rsplit("-", 1)[-1]: t.split(" on ", 1)[1].split(",", 1)[0] for n, t in stacks.items()}
    assert sorted(on.values()) == ["n1", "n2"], on
    assert all(f"-{node}-{rank}" in name for rank, node in on.items() for name in stacks if name.endswith(rank))
    rank1 = next(t for n, t in stacks.items() if n.endswith("rank1.txt"))
    assert "in block_forever" in rank1, rank1
    node = on["rank1.txt"]
    assert detail["ranks"] == [1] and detail["nodes"] == [node] and not detail["fallout"], detail
    assert "block_forever" in detail["frame"] and f"rank 1 on {node} in block_forever" in detail["error"], detail
    assert detail["nodes_reported"] == ["n1", "n2"], detail
    (retry,) = [e.data() for e in events.events(run_dir) if e.kind is EventKind.RETRYING]
    assert "avoid_nodes" not in retry and retry["not_avoided"] == [node], retry
    assert retry["note"] == f"not avoiding {node}: partition debug has 2 usable nodes, the job needs 2", retry
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id(sweep)], capture_output=True, text=True).stdout
    assert "ExcNodeList=(null)" in shown, shown
    assert record_kinds(run_dir).count("started") == 2
    assert events.read(run_dir).state is State.COMPLETED

    assert_weights_of_a_run_that_never_hung(run_dir, ref, common, tmp_path, timeout=400)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_a_hung_one_node_job_on_a_one_node_partition_is_retried_on_that_node_saying_so(tmp_path):
    """Partition `short` has n1 alone: excluding it would leave the requeued job nowhere to run. Not excluded,
    said in the retrying record, and the retry completes there."""
    import subprocess

    from slurm_helpers import job_id

    sweep, marker = tmp_path / "sweep", tmp_path / "hung-once"
    run_hpctrain(["-m", *TASK, "+model.hang_at=30", f"+model.marker={marker}", "hydra/launcher=slurm",
                  "hydra.launcher.partition=short", "hydra.launcher.timeout_min=10", "hydra.launcher.tasks_per_node=2",
                  "hang_timeout_s=5", "hydra.launcher.wait=true", "hydra.launcher.max_retries=1",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path, timeout=400)
    (run_dir,) = run_dirs(sweep)
    (hung,) = [e.data() for e in events.events(run_dir) if e.kind is EventKind.HUNG]
    assert hung["nodes"] == ["n1"] and hung["ranks"] == [1], hung
    (retry,) = [e.data() for e in events.events(run_dir) if e.kind is EventKind.RETRYING]
    assert retry.get("not_avoided") == ["n1"] and "avoid_nodes" not in retry, retry
    assert retry["note"] == "not avoiding n1: partition short has 1 usable node, the job needs 1", retry
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id(sweep)], capture_output=True, text=True).stdout
    assert "ExcNodeList=(null)" in shown, shown
    assert events.read(run_dir).state is State.COMPLETED
