"""Units of work: a run paused at a unit's end and resumed equals an uninterrupted one; the paused state."""

import json
import os

import torch

from trainer_helpers import compose

from hpctrain.core import events
from hpctrain.core.state import State
from hpctrain.search.units import Unit, UnitKind, outcome
from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer

CFG = ["max_steps=40", "eval_every=10", "log_every=5", "ckpt_every=0", "warmup_steps=5"]


class EndAt:
    """A search unit's hook: the run stops at ``end``."""

    def __init__(self, end):
        self.end, self.ended = end, None

    def on_start(self, step):
        pass

    def on_eval(self, step, metrics):
        return None

    def should_stop(self, step):
        return False

    def on_stop(self, step):
        raise AssertionError("not asked to stop")

    def on_end(self, step, status):
        self.ended = (step, status)

    def end_step(self):
        return self.end


def _tb_steps(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_a_unit_that_ends_before_max_steps_pauses_there_and_its_resume_equals_an_uninterrupted_run(tmp_path):
    whole = Trainer(compose(CFG), tmp_path / "whole", DistInfo()).fit()
    assert whole["status"] == "completed"
    split = tmp_path / "split"
    first = EndAt(10)
    result = Trainer(compose(CFG), split, DistInfo(), hooks=[first]).fit()
    assert result["status"] == "paused" and result["step"] == 10 and first.ended == (10, State.PAUSED)
    assert _weights(split)["step"] == 10  # checkpointed at exactly the unit's end
    assert json.loads((split / "metrics.json").read_text())["status"] == "paused"
    second = EndAt(30)
    assert Trainer(compose(CFG), split, DistInfo(), hooks=[second]).fit()["step"] == 30
    assert Trainer(compose(CFG), split, DistInfo(), hooks=[EndAt(None)]).fit()["status"] == "completed"
    a, b = _weights(tmp_path / "whole"), _weights(split)
    assert a["step"] == b["step"] == 40
    assert a["scheduler"] == b["scheduler"]  # the LR schedule spans max_steps in every unit
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    # one TensorBoard run, its curve continuous across the pauses: every step of the whole run's, once
    assert [s for s, _ in _tb_steps(split, "train/loss")] == [s for s, _ in _tb_steps(tmp_path / "whole", "train/loss")]
    assert [s for s, _ in _tb_steps(split, "val/loss")] == [10, 20, 30, 40]


def test_a_unit_resumed_at_or_past_its_end_pauses_again_without_training(tmp_path):
    Trainer(compose(CFG), tmp_path, DistInfo(), hooks=[EndAt(20)]).fit()
    again = Trainer(compose(CFG), tmp_path, DistInfo(), hooks=[EndAt(20)]).fit()
    assert again["status"] == "paused" and again["step"] == 20


def test_paused_is_neither_active_nor_final_and_a_new_start_runs_again(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path, job_id="1")
    events.paused(tmp_path, step=10)
    rs = events.read(tmp_path)
    assert rs.state is State.PAUSED and not rs.active and not rs.final
    events.started(tmp_path, job_id="2")
    assert events.read(tmp_path).state is State.RUNNING
    events.paused(tmp_path, step=30)
    events.pruned(tmp_path, step=30, reason="not promoted")
    assert events.read(tmp_path).state is State.PRUNED


def _in_job(job: str, restart: int = 0):
    """The environment of one Slurm attempt of an array task (what keys its events)."""
    from unittest import mock

    array, task = job.split("_")
    return mock.patch.dict(os.environ, {"SLURM_ARRAY_JOB_ID": array, "SLURM_ARRAY_TASK_ID": task,
                                        "SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": str(restart)})


def test_a_promotion_is_not_a_restart_and_a_workers_next_unit_of_the_same_trial_runs(tmp_path):
    """Worker 100_0 runs a trial's first unit and, in the same Slurm attempt, its promotion; worker 100_1
    promotes it again, is requeued by Slurm mid-unit and resumes it. Two scheduled units and one requeue:
    one restart, and the trial is running (not paused) while its worker's second unit runs."""
    events._own_attempt.clear()
    events.submitted(tmp_path)
    with _in_job("100_0"):
        events.started(tmp_path, job_id="100_0", how="new")
        events.paused(tmp_path, step=10)
        events.started(tmp_path, job_id="100_0", how="promote")
        rs = events.read(tmp_path)
        assert rs.state is State.RUNNING and rs.restarts == 0 and rs.attempts == 2
        events.paused(tmp_path, step=30)
    assert events.read(tmp_path).state is State.PAUSED
    with _in_job("100_1"):
        events.started(tmp_path, job_id="100_1", how="promote")
        events.requeued(tmp_path)
    assert events.read(tmp_path).restarts == 0  # requeued: not started again yet
    with _in_job("100_1", restart=1):
        events.started(tmp_path, job_id="100_1", how="resumed")
        assert events.read(tmp_path).restarts == 1
        events.completed(tmp_path)
    rs = events.read(tmp_path)
    assert rs.state is State.COMPLETED and rs.attempts == 4 and rs.units == 2 and rs.restarts == 1


def test_units_round_trip_through_a_claim_and_none_is_one_unit_to_max_steps():
    u = Unit(3, UnitKind.PROMOTE, 10, 30, {"lr": 0.1}, None, 1, 0)
    assert Unit.from_fields(json.loads(json.dumps(u.fields()))) == u
    assert outcome(u, 90) is State.PAUSED and outcome(u, 30) is State.COMPLETED
    from hpctrain.search.space import parse
    from hpctrain.search.settings import Settings
    from hpctrain.search.study import build_scheduler

    assert Unit(None, UnitKind.NEW, 0, 40).numbered(0).trial == 0
    # none: no scheduler, each trial one run to max_steps while the budget lasts (Leases.decide)
    assert build_scheduler(Settings(space=parse(["lr=interval(0.1,1)"])[0], n_trials=2, n_workers=1)) is None


def test_a_unit_with_copy_from_copies_the_donors_checkpoints_and_leaves_the_donors_in_place(tmp_path):
    from hpctrain.core import manifest
    from hpctrain.core.run import RunSpec
    from hpctrain.search import exploit
    from hpctrain.search.space import trial_dirname

    donor = tmp_path / trial_dirname(0, {"lr": 0.5})
    (donor / "checkpoints").mkdir(parents=True)
    (donor / "checkpoints" / "last.pt").write_bytes(b"donor weights")

    def add(m):
        m.runs[0] = manifest.RunEntry(RunSpec(0, ("lr=0.5",), donor, 40), "1", {"trial": 0})

    manifest.update(tmp_path, add)
    own = tmp_path / trial_dirname(1, {"lr": 0.1})
    (own / "checkpoints").mkdir(parents=True)
    (own / "checkpoints" / "last.pt").write_bytes(b"own weights")
    unit = Unit(1, UnitKind.CONTINUE, 10, 20, {"lr": 0.2}, copy_from=0, index=1)
    exploit.keep(donor, 10)  # the donor's boundary at the copy step (its unit's end: SearchWorker._run)
    exploit.before(tmp_path, 1, unit, {"lr": 0.2})  # what SearchWorker._lead does before announcing the unit
    assert (own / "checkpoints" / "last.pt").read_bytes() == b"donor weights"
    assert (donor / "checkpoints" / "last.pt").read_bytes() == b"donor weights"  # copied, never moved
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("trial-")) == [donor.name, own.name]
