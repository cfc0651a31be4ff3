"""Units of work: a run paused at a unit's end and resumed equals an uninterrupted one; the paused state."""

import json

import torch

from trainer_helpers import compose

from hpctrain.core import events
from hpctrain.core.state import State
from hpctrain.search.units import NoScheduler, Next, StudyView, Unit, UnitKind, outcome
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


def test_units_round_trip_through_a_claim_and_none_is_one_unit_to_max_steps():
    u = Unit(3, UnitKind.PROMOTE, 10, 30, {"lr": 0.1}, None, 1, 0)
    assert Unit.from_fields(json.loads(json.dumps(u.fields()))) == u
    assert outcome(u, 90) is State.PAUSED and outcome(u, 30) is State.COMPLETED
    none = NoScheduler(40)
    got = none.next_unit(StudyView([], n_trials=2, max_steps=40))
    assert got == Unit(None, UnitKind.NEW, 0, 40) and got.numbered(0).trial == 0
    assert none.next_unit(StudyView([object(), object()], n_trials=2, max_steps=40)) is Next.DONE
