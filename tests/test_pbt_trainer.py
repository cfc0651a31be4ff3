"""The trainer's side of PBT: a resume takes the config's hyperparameters over the checkpoint's, and the
``schedule`` key replays such changes within one run (the same weights as the resumed runs)."""

import pytest
import torch

from trainer_helpers import compose

from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer, read_schedule

BASE = ["log_every=5", "eval_every=5", "ckpt_every=5", "warmup_steps=2", "min_lr_ratio=1.0",
        "data.train_size=256", "data.val_size=64", "model.hidden=16", "lr=0.01"]


def test_a_resume_with_new_values_sets_the_optimizer_and_scheduler_to_them(tmp_path):
    Trainer(compose(BASE + ["max_steps=10"]), tmp_path, DistInfo()).fit()
    t = Trainer(compose(BASE + ["max_steps=20", "lr=0.002", "optim.weight_decay=0.05", "grad_clip=0.5"]),
                tmp_path, DistInfo())
    assert t.step == 10
    assert t.scheduler.base_lrs == [0.002, 0.002]
    assert [g["lr"] for g in t.optimizer.param_groups] == [pytest.approx(0.002)] * 2
    assert [g["weight_decay"] for g in t.optimizer.param_groups] == [0.05, 0.0]  # biases keep none
    assert t.every.grad_clip == 0.5
    t.fit()
    assert t.scheduler.get_last_lr() == [pytest.approx(0.002)] * 2


def test_a_resume_with_the_same_values_changes_nothing(tmp_path):
    Trainer(compose(BASE + ["max_steps=10"]), tmp_path, DistInfo()).fit()
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    t = Trainer(compose(BASE + ["max_steps=20"]), tmp_path, DistInfo())
    assert t.optimizer.state_dict()["param_groups"] == saved["optimizer"]["param_groups"]
    assert t.scheduler.state_dict() == saved["scheduler"]


def test_a_schedule_replays_resumes_with_new_values_as_one_run(tmp_path):
    paused, whole = tmp_path / "paused", tmp_path / "whole"
    Trainer(compose(BASE + ["max_steps=10"]), paused, DistInfo()).fit()
    changed = ["lr=0.002", "optim.weight_decay=0.05"]
    Trainer(compose(BASE + ["max_steps=15"] + changed), paused, DistInfo()).fit()
    Trainer(compose(BASE + ["max_steps=20", "lr=0.004"]), paused, DistInfo()).fit()
    schedule = "schedule=[{step:10,lr:0.002,optim.weight_decay:0.05},{step:15,lr:0.004,optim.weight_decay:0.1}]"
    one = Trainer(compose(BASE + ["max_steps=20", schedule]), whole, DistInfo())
    one.fit()
    a = torch.load(paused / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


def test_a_schedule_entry_at_step_0_and_a_resume_in_the_middle_of_one(tmp_path):
    schedule = "schedule=[{step:0,lr:0.005},{step:5,lr:0.001}]"
    Trainer(compose(BASE + ["max_steps=3", schedule]), tmp_path, DistInfo()).fit()
    t = Trainer(compose(BASE + ["max_steps=10", schedule]), tmp_path, DistInfo())
    assert t.scheduler.base_lrs == [0.005, 0.005]  # step 3: the step-0 entry, not the config's lr
    t.fit()
    assert t.scheduler.base_lrs == [0.001, 0.001]


@pytest.mark.parametrize("bad, says", [([{"lr": 0.1}], "integer step"),
                                       ([{"step": 3, "batch_size": 8}], "schedule[0].batch_size: cannot change")])
def test_a_bad_schedule_is_refused(bad, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        read_schedule(bad)
