"""The trainer's side of PBT: a resume takes the config's hyperparameters over the checkpoint's, and the
``schedule`` key replays such changes within one run (the same weights as the resumed runs)."""

import pytest
import torch

from trainer_helpers import compose

from hpctrain.train.distributed import DistInfo
from hpctrain.schema import read_schedule
from hpctrain.train.trainer import Trainer

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


def test_a_value_the_optimizer_does_not_hold_fails_the_run_instead_of_changing_nothing(tmp_path):
    # AdamW has no momentum: the entry would be a silent no-op (the login node refuses it from the config's
    # optim keys; the trainer checks the optimizer itself, e.g. for a user's own optimizer)
    with pytest.raises(ValueError, match="optim.momentum: the optimizer AdamW has no 'momentum'"):
        Trainer(compose(BASE + ["max_steps=5", "schedule=[{step:0,optim.momentum:0.5}]"]), tmp_path, DistInfo())
    t = Trainer(compose(BASE + ["max_steps=5", "schedule=[{step:0,optim.eps:1e-6}]"]), tmp_path / "ok", DistInfo())
    assert [g["eps"] for g in t.optimizer.param_groups] == [1e-6, 1e-6]


# ---------------------------------------------------------------- an exploit as the trainer sees it
PBT = ["log_every=5", "eval_every=5", "ckpt_every=5", "warmup_steps=0", "min_lr_ratio=1.0",
       "data.train_size=256", "data.val_size=64", "model.hidden=16", "max_steps=20"]


def unit(run_dir, lr, end):
    """One PBT unit of the trainer up to ``end`` (the search bridge's end step), then the kept boundary."""
    from hpctrain.search import exploit
    from hpctrain.search.bridge import TrialBridge

    t = Trainer(compose(PBT + [f"lr={lr}"]), run_dir, DistInfo(), hooks=[TrialBridge(0, "val/loss", end=end)])
    result = t.fit()
    exploit.after_unit(run_dir, end, 20)
    return t, result


def test_a_constant_lr_is_constant_at_every_step():
    from hpctrain.train.trainer import lr_lambda

    assert {lr_lambda(0, 20, 1.0)(s) for s in range(25)} == {1.0}


def test_an_exploit_continues_from_the_donors_weights_and_optimizer_with_the_explored_lr(tmp_path):
    from hpctrain.search import exploit

    donor, me, whole = tmp_path / "donor", tmp_path / "me", tmp_path / "whole"
    unit(donor, 0.05, 10)
    unit(me, 0.002, 10)
    saved = torch.load(exploit.kept_dir(donor, 10) / "last.pt", weights_only=True)
    exploit.before_unit(me, 10, {"lr": 0.04}, donor, 0)  # the donor's lr x 0.8
    t = Trainer(compose(PBT + ["lr=0.04"]), me, DistInfo())
    assert t.step == 10
    model = t.raw_model.state_dict()
    assert all(torch.equal(model[k], saved["model"][k]) for k in saved["model"])  # the donor's weights
    opt = t.optimizer.state_dict()["state"]
    for i, s in saved["optimizer"]["state"].items():  # Adam's moments and step count: the donor's
        assert all(torch.equal(opt[i][k], v) for k, v in s.items())
    assert [g["lr"] for g in t.optimizer.param_groups] == [0.04, 0.04]  # the next step uses the explored lr
    assert t.scheduler.base_lrs == [0.04, 0.04]
    lrs = []
    step = t.optimizer.step
    t.optimizer.step = lambda *a, **k: (lrs.append([g["lr"] for g in t.optimizer.param_groups]), step(*a, **k))[1]
    t.fit()
    assert lrs == [[0.04, 0.04]] * 10  # every step of the unit, none at the donor's 0.05
    # the same as the donor's run with its lr changed at step 10: one run, the trainer's schedule key
    Trainer(compose(PBT + ["lr=0.05", "schedule=[{step:10,lr:0.04}]"]), whole, DistInfo()).fit()
    a = torch.load(me / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_the_objective_at_a_boundary_is_an_eval_of_the_weights_at_that_step(tmp_path):
    """A decision compares every member at the same step: the value reported at the unit's end is a fresh
    eval of the weights saved there (not the last log's, not an earlier eval's)."""
    from hpctrain.train.evaluation import evaluate

    t, result = unit(tmp_path, 0.05, 10)
    assert result["step"] == 10 and result["status"] == "paused"
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert saved["step"] == 10
    t.raw_model.load_state_dict(saved["model"])
    fresh = evaluate(t.raw_model, t.val_set, t.forward, t.metric_fns, t.micro_bs, t.info, t.autocast)
    assert result["objective"]["value"] == pytest.approx(fresh["val/loss"], rel=1e-6)
