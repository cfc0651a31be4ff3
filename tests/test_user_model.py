"""A user's own model class, from outside the package, plugged in by `_target_`."""

import json

import torch

from cli_helpers import run_hpctrain, tb_scalars


def test_user_model_by_target(tmp_path):
    run_dir = tmp_path / "run"
    run_hpctrain(["model._target_=user_models.TinyNet", "+model.width=24", "max_steps=60", f"hydra.run.dir={run_dir}"],
                 cwd=tmp_path)
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "completed"
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert set(state) == {"body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"}
    assert state["body.0.weight"].shape == (24, 32)  # width from the command line, in_features from the data
    losses = tb_scalars(run_dir, "train/loss")
    assert losses[-1] < losses[0]


def test_user_data_and_optimizer_by_target(tmp_path):
    run_dir = tmp_path / "run"
    run_hpctrain(["data._target_=user_models.sign_data", "optim._target_=torch.optim.RMSprop", "lr=1e-3",
                  "max_steps=60", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "completed"
    assert "val/loss" not in record["metrics"]  # a plain Dataset: no validation split
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert "square_avg" in next(iter(state["optimizer"]["state"].values()))  # RMSprop's own state
    losses = tb_scalars(run_dir, "train/loss")
    assert losses[-1] < 0.5 * losses[0]


def test_builtin_cnn_and_gpt_train(tmp_path):
    for name, args in {"cnn": ["model=cnn", "data=images", "optim=sgd", "lr=0.05"],
                       "gpt": ["model=gpt", "data=tokens", "batch_size=16", "model.n_layer=1"]}.items():
        run_dir = tmp_path / name
        run_hpctrain(args + ["max_steps=40", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        losses = tb_scalars(run_dir, "train/loss")
        assert losses[-1] < losses[0], (name, losses)
    assert tb_scalars(tmp_path / "gpt", "perf/tokens_per_s")  # an LM reports tokens/s too
    assert tb_scalars(tmp_path / "cnn", "perf/samples_per_s")


def test_a_model_whose_outputs_do_not_fit_the_data_fails_before_step_0_naming_both_keys(tmp_path):
    import json

    from cli_helpers import run_hpctrain
    from slurm_helpers import record_kinds

    sweep = tmp_path / "s"
    proc = run_hpctrain(["-m", "model.num_classes=4,8", "max_steps=5", "hydra/launcher=local",
                         "hydra.launcher.max_retries=1", f"hydra.sweep.dir={sweep}"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    bad = next(p for p in sweep.iterdir() if p.name.startswith("0_"))
    summary = json.loads((bad / "metrics.json").read_text())
    assert summary["status"] == "failed" and not summary.get("step")  # before step 0
    assert ("model._target_=hpctrain.train.models.mlp.MLP gives 4 class score(s) per sample, but "
            "data._target_=hpctrain.train.datasets.synthetic.gaussian_classes has class labels up to 7") in summary["error"]
    assert record_kinds(bad) == ["submitted", "started", "failed"]  # the same on every attempt: not retried
    good = next(p for p in sweep.iterdir() if p.name.startswith("1_"))
    assert json.loads((good / "metrics.json").read_text())["status"] == "completed"


def test_a_class_count_mismatch_of_a_model_without_num_classes_names_no_such_key(tmp_path):
    from cli_helpers import run_hpctrain

    run_dir = tmp_path / "run"
    proc = run_hpctrain(["model._target_=user_models.FourScores", "data.num_classes=8", "max_steps=5",
                         f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    error = json.loads((run_dir / "metrics.json").read_text())["error"]
    assert "gives 4 class score(s) per sample" in error
    assert "model.num_classes" not in error, error  # FourScores takes no such key: advice it could not follow
    assert "make the model's last layer give the data's classes (data.num_classes (now 8)) scores" in error
