"""A user's own task: torchvision-style int labels, regression losses, Hugging Face-style dict batches,
the model's own loss, metrics and the objective; clear errors for what does not fit."""

import json

import pytest

from cli_helpers import run_hpctrain, tb_scalars


def _record(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())


def test_conv_net_on_int_labels(tmp_path):
    """(image tensor, int label) samples through the default collate; accuracy on for a classification set."""
    run_dir = tmp_path / "run"
    run_hpctrain(["data._target_=user_models.int_label_images", "data.num_classes=4", "data.train_size=512",
                  "data.val_size=256", "model._target_=user_models.TinyConv", "batch_size=32", "max_steps=60",
                  "lr=1e-2", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    record = _record(run_dir)
    assert record["status"] == "completed"
    assert record["metrics"]["val/accuracy"] > 0.6  # 4 classes: chance is 0.25
    assert record["objective"] == {"metric": "val/loss", "mode": "min", "value": record["metrics"]["val/loss"]}
    assert tb_scalars(run_dir, "val/accuracy") == [pytest.approx(record["metrics"]["val/accuracy"], rel=1e-6)]
    assert tb_scalars(run_dir, "perf/samples_per_s")
    assert "perf/tokens_per_s" not in record["metrics"]  # int labels: samples, not tokens


@pytest.mark.parametrize("loss", [["loss=mse"], ["loss._target_=torch.nn.HuberLoss", "+loss.delta=0.5",
                                                 "+data.tensor_targets=true"]])
def test_regression(tmp_path, loss):
    """mse on Python-float targets; torch.nn.HuberLoss built with its key, on (N, 1) tensor targets."""
    run_dir = tmp_path / "run"
    run_hpctrain(loss + ["data._target_=user_models.regression_data", "model._target_=user_models.Regressor",
                         "~metrics.accuracy", "data.num_features=4", "lr=2e-2", "max_steps=80", "eval_every=40",
                         f"hydra.run.dir={run_dir}"],
                 cwd=tmp_path)
    record = _record(run_dir)
    assert record["status"] == "completed"
    val = tb_scalars(run_dir, "val/loss")
    first = tb_scalars(run_dir, "train/loss")[0]
    assert len(val) == 2 and val[-1] < 0.1 < first, (first, val)  # predicting 0 costs about 2.2 (mse)
    assert record["objective"]["value"] == pytest.approx(val[-1], rel=1e-6)  # TensorBoard keeps float32


def test_a_regression_data_set_runs_with_one_command(tmp_path):
    """data=regression picks loss=mse and no accuracy (a regression has no classes); a command-line loss wins."""
    run_dir = tmp_path / "run"
    run_hpctrain(["data=regression", "max_steps=100", "eval_every=50", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    record = _record(run_dir)
    assert record["status"] == "completed"
    assert set(k for k in record["metrics"] if k.startswith("val/")) == {"val/loss"}, record["metrics"]
    val, first = tb_scalars(run_dir, "val/loss"), tb_scalars(run_dir, "train/loss")[0]
    assert len(val) == 2 and val[-1] < 0.5 * first, (first, val)  # predicting 0 costs about 0.5 (mse)
    from trainer_helpers import compose

    assert compose(["data=regression"]).loss._target_ == "hpctrain.train.losses.mse"
    assert compose(["data=regression", "loss=model"]).loss._target_ == "hpctrain.train.losses.from_model"
    assert compose(["data=regression"]).model.num_classes == 1  # one output per target value
    assert compose(["data=regression", "data.num_targets=3"]).model.num_classes == 3


def test_mse_on_own_float_targets_leaves_the_default_accuracy_out(tmp_path):
    """loss=mse on a user's float targets keeps the classification group's metrics: accuracy, which does not apply,
    is left out with one line (not a failure at the first eval), and nothing else changes."""
    run_dir = tmp_path / "run"
    proc = run_hpctrain(["loss=mse", "data._target_=user_models.regression_data", "model._target_=user_models.Regressor",
                         "data.num_features=4", "lr=2e-2", "max_steps=40", "eval_every=20", f"hydra.run.dir={run_dir}"],
                        cwd=tmp_path)
    record = _record(run_dir)
    assert record["status"] == "completed" and "val/accuracy" not in record["metrics"], record
    assert len(tb_scalars(run_dir, "val/loss")) == 2
    assert "metrics.accuracy left out: data._target_=user_models.regression_data has float targets" in proc.stderr + proc.stdout


@pytest.mark.parametrize("args, message", [
    (["data=regression", "loss=cross_entropy"],
     "loss=cross_entropy (the default) needs integer class labels, but "
     "data._target_=hpctrain.train.datasets.synthetic.smooth_regression has float targets (a regression): add loss=mse"),
    (["loss=mse"], "loss=mse is a regression loss, but data._target_=hpctrain.train.datasets.synthetic.gaussian_classes "
                   "has integer class labels and model._target_=hpctrain.train.models.mlp.MLP gives (4, 8) outputs for "
                   "(4,) targets: use loss=cross_entropy for classes, or a data set with float targets (data=regression)"),
    (["loss=mse", "data._target_=user_models.regression_data", "model._target_=user_models.Regressor",
      "data.num_features=4", "objective.metric=val/accuracy"],
     "objective.metric=val/accuracy: data._target_=user_models.regression_data has float targets (a regression), "
     "which have no accuracy"),
])
def test_a_loss_that_does_not_fit_the_targets_fails_before_step_0(tmp_path, args, message):
    run_dir = tmp_path / "run"
    proc = run_hpctrain(args + ["max_steps=2", "batch_size=32", f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    record = _record(run_dir)
    assert record["status"] == "failed" and not record.get("step"), record
    assert message in record["error"].splitlines()[-1], record["error"]


def test_dict_batches_and_model_loss(tmp_path):
    """A Hugging Face-style model on dict batches; a nanoGPT-style (logits, loss) model with loss=model."""
    hf = tmp_path / "hf"
    run_hpctrain(["data._target_=user_models.dict_tokens", "model._target_=user_models.TinyCausalLM",
                  "+model.vocab_size=16", "max_steps=60", "lr=3e-2", f"hydra.run.dir={hf}"], cwd=tmp_path)
    record = _record(hf)
    assert record["status"] == "completed"
    losses = tb_scalars(hf, "train/loss")
    assert losses[-1] < 0.3 * losses[0], losses
    assert record["metrics"]["val/accuracy"] > 0.9  # per token: the next token is the current + 1
    assert tb_scalars(hf, "perf/tokens_per_s")  # integer label sequences: tokens counted

    pair = tmp_path / "pair"
    run_hpctrain(["loss=model", "model._target_=user_models.LogitsAndLoss", "max_steps=40",
                  f"hydra.run.dir={pair}"], cwd=tmp_path)
    record = _record(pair)
    assert record["status"] == "completed"
    assert "val/accuracy" in record["metrics"]  # the logits of (logits, loss) feed the metrics
    losses = tb_scalars(pair, "train/loss")
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("args, message", [
    (["loss=model", "model._target_=user_models.IgnoresTargets"],
     "loss._target_=hpctrain.train.losses.from_model: the model returned a tensor of shape (32, 8) with no loss; "
     "expected a scalar tensor, (logits, loss), .loss or ['loss']"),
    (["loss=model"], "loss._target_=hpctrain.train.losses.from_model: MLP.forward takes no targets; expected "
                     "forward(inputs, targets)"),
    (["+metrics.broken._target_=user_models.broken_metric"],
     "metrics.broken (broken_metric) raised KeyError: 'no such column'; expected a callable (outputs, targets) -> tensor"),
])
def test_runtime_errors_name_the_key(tmp_path, args, message):
    run_dir = tmp_path / "run"
    proc = run_hpctrain(args + ["max_steps=2", "batch_size=32", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
                        check=False)
    assert proc.returncode != 0
    record = _record(run_dir)
    assert record["status"] == "failed"
    assert message in record["error"].splitlines()[-1], record["error"]


@pytest.mark.parametrize("args, message", [
    (["loss._target_=user_models.SCALE"],
     "loss._target_='user_models.SCALE': user_models.SCALE is a constant (int), expected a callable"),
    (["objective.metric=val/acc"], "objective.metric='val/acc': no run of this config logs it; expected one of "
                                   "train/loss, train/lr, val/loss, val/accuracy"),
    (["~metrics.accuracy", "objective.metric=val/accuracy"], "objective.metric='val/accuracy': no run"),
    (["objective.mode=maximize"], "objective.mode='maximize': expected one of min, max"),
    (["+metrics.f1._target_=user_models.f1"], "metrics.f1._target_='user_models.f1': module 'user_models' has no 'f1'"),
])
def test_login_node_refuses_what_cannot_work(tmp_path, args, message):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-2", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"] + args,
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not sweep.exists() or not [p for p in sweep.iterdir() if p.is_dir()]  # no run, no submission


def test_loss_targets_are_referenced_or_built():
    """A function is referenced (not called) when built, a class is built with its keys; a constant is refused."""
    import torch
    from torch.nn import functional as F

    from hpctrain.train.build import build_loss
    from trainer_helpers import compose

    assert build_loss(compose(["loss._target_=torch.nn.functional.smooth_l1_loss"]).loss) is F.smooth_l1_loss
    huber = build_loss(compose(["loss._target_=torch.nn.HuberLoss", "+loss.delta=0.5"]).loss)
    assert isinstance(huber, torch.nn.HuberLoss) and huber.delta == 0.5
    bound = build_loss(compose(["loss._target_=torch.nn.functional.smooth_l1_loss", "+loss.beta=0.25"]).loss)
    assert bound(torch.zeros(2), torch.ones(2)).item() == pytest.approx(1 - 0.125)  # beta bound as a keyword
    with pytest.raises(TypeError, match=r"loss._target_='user_models.SCALE' is a int, expected a callable"):
        build_loss(compose(["loss._target_=user_models.SCALE"]).loss)
