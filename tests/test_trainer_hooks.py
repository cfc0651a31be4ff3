"""Trainer hooks: a hook that stops the run at an eval ends it through the one ending path, as pruned."""

import json

import torch

from cli_helpers import tb_scalars
from trainer_helpers import compose

from hpctrain.core.state import State
from hpctrain.core import events
from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer


class PruneAt:
    def __init__(self, step):
        self.step, self.seen, self.ended = step, [], None

    def on_start(self, step):
        pass

    def on_eval(self, step, metrics):
        self.seen.append((step, dict(metrics)))
        return "a test pruner" if step >= self.step else None

    def should_stop(self, step):
        return False

    def on_stop(self, step):
        raise AssertionError("not asked to stop")

    def on_end(self, step, status):
        self.ended = (step, status)


def test_a_hook_that_stops_at_an_eval_ends_the_run_as_pruned(tmp_path):
    hook = PruneAt(20)
    trainer = Trainer(compose(["max_steps=100", "eval_every=10", "log_every=5", "ckpt_every=0"]), tmp_path, DistInfo(),
                      hooks=[hook])
    result = trainer.fit()
    assert [s for s, _ in hook.seen] == [10, 20] and "val/loss" in hook.seen[0][1]
    assert hook.ended == (20, State.PRUNED)
    assert result["status"] == "pruned" and result["step"] == result["pruned_at"] == 20
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["status"] == "pruned" and summary["step"] == 20 and "val/loss" in summary["metrics"]
    assert events.read(tmp_path).state == State.PRUNED  # the record's final event
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["step"] == 20  # the final checkpoint
    assert len(tb_scalars(tmp_path, "val/loss")) == 2  # the eval at 20 counts as the final one: not run twice
    assert tb_scalars(tmp_path, "search/pruned") == [1.0]
    assert list((tmp_path / "tb").glob("events.*"))  # hparams written by the same path as a completed run's


def test_a_completed_run_takes_the_same_path(tmp_path):
    hook = PruneAt(10**9)
    result = Trainer(compose(["max_steps=20", "eval_every=10", "log_every=5"]), tmp_path, DistInfo(),
                     hooks=[hook]).fit()
    assert result["status"] == "completed" and "pruned_at" not in result
    assert hook.ended == (20, State.COMPLETED)
    assert [s for s, _ in hook.seen] == [10]  # not asked at the last step: the run ends there anyway
    assert len(tb_scalars(tmp_path, "val/loss")) == 2  # step 10 and the final eval
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["step"] == 20
