"""How much of the validation set an evaluation reads: ``eval_batches`` micro-batches, 0 for all of it."""

import pytest

from trainer_helpers import compose

from hpctrain.train.datasets.synthetic import TensorData
from hpctrain.train.distributed import DistInfo
from hpctrain.train.evaluation import evaluate
from hpctrain.train.trainer import Trainer

BASE = ["max_steps=2", "log_every=1", "eval_every=2", "ckpt_every=0", "data.train_size=64", "data.val_size=80",
        "batch_size=16", "model.hidden=8"]


def Subset(base: TensorData, indices: range) -> TensorData:
    """The first samples of a synthetic set, as a set of their own."""
    return TensorData(base.x[indices.start:indices.stop], base.y[indices.start:indices.stop])


def _eval(t: Trainer, val_set, max_batches: int) -> float:
    return evaluate(t.raw_model, val_set, t.forward, t.metric_fns, t.micro_bs, t.info, t.autocast,
                    max_batches=max_batches)["val/loss"]


def test_eval_batches_reads_the_first_micro_batches_and_0_reads_all(tmp_path):
    t = Trainer(compose(BASE), tmp_path, DistInfo())
    assert _eval(t, t.val_set, 2) == pytest.approx(_eval(t, Subset(t.val_set, range(32)), 0), rel=1e-6)
    assert _eval(t, t.val_set, 0) == pytest.approx(_eval(t, Subset(t.val_set, range(80)), 100), rel=1e-6)
    assert _eval(t, t.val_set, 0) != pytest.approx(_eval(t, t.val_set, 2), rel=1e-6)


@pytest.mark.parametrize("eval_batches, samples", [(1, 16), (0, 80)])
def test_the_trainer_evaluates_what_eval_batches_says(tmp_path, eval_batches, samples):
    t = Trainer(compose(BASE + [f"eval_batches={eval_batches}"]), tmp_path, DistInfo())
    result = t.fit()
    assert result["metrics"]["val/loss"] == pytest.approx(_eval(t, Subset(t.val_set, range(samples)), 0), rel=1e-6)
