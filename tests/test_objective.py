"""Metrics across ranks, the objective in metrics.json and TensorBoard's HParams, and a released Hydra
search sweeper over hpctrain's local launcher."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cli_helpers import hpctrain_env, run_hpctrain
from trainer_helpers import compose


def _run_dirs(sweep):
    return sorted((p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: int(p.name.split("_")[0]))


def test_accuracy_over_two_ranks_equals_one_process(tmp_path):
    """2 gloo ranks with uneven shards (1001 samples); the sample-weighted mean equals a plain computation."""
    overrides = ["max_steps=20", "eval_every=0", "batch_size=64", "data.val_size=1001"]
    run_hpctrain(["-m", *overrides, "hydra/launcher=local", "hydra.launcher.tasks_per_node=2",
                  f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    (run_dir,) = _run_dirs(tmp_path / "s")
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "completed" and record["world_size"] == 2

    from hpctrain.train.build import build_data, build_model

    cfg = compose(overrides)
    model = build_model(cfg.model)
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["model"])
    val = build_data(cfg.data).val
    with torch.no_grad():
        logits = model(val.x)
    accuracy = (logits.argmax(-1) == val.y).float().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, val.y).item()
    assert record["metrics"]["val/accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert record["metrics"]["val/loss"] == pytest.approx(loss, rel=1e-5)


def _hparams_experiment(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment


def test_sweep_by_accuracy_max(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "lr=1e-4,3e-3", "objective.metric=val/accuracy", "objective.mode=max", "max_steps=40",
                  "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    runs = _run_dirs(sweep)
    values = []
    for run_dir in runs:
        record = json.loads((run_dir / "metrics.json").read_text())
        assert record["objective"] == {"metric": "val/accuracy", "mode": "max",
                                       "value": record["metrics"]["val/accuracy"]}
        values.append(record["objective"]["value"])
        # HParams: exactly the swept key (the command line's constants go to the config text), marked
        # `differs`; the objective as the first metric
        exp = _hparams_experiment(run_dir)
        assert [(h.name, h.differs) for h in exp.hparam_infos] == [("lr", True)]
        tags = [m.name.tag for m in exp.metric_infos]
        assert tags[0] == "val/accuracy" and {"val/loss", "train/loss"} <= set(tags)
    assert values[1] > values[0]  # 40 steps at lr=1e-4 barely move
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "report", str(sweep), "--metric", "val/accuracy",
                           "--mode", "max"], cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"best:\s+#1 .*val/accuracy", proc.stdout), proc.stdout


@pytest.fixture(scope="session")
def optuna_python(tmp_path_factory):
    """A virtual environment with Hydra's released Optuna sweeper (it pins optuna<3; sqlalchemy<2 and an
    alembic of that time work with it), layered over this environment's packages (torch, hpctrain, hydra,
    numpy, colorlog) with a .pth file. Only what must differ is installed, without dependencies, by this
    environment's pip (a full resolve into a bare venv took 35 s of the suite)."""
    import sysconfig

    venv = tmp_path_factory.mktemp("optuna") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                          "hydra-optuna-sweeper==1.2.0", "optuna<3", "sqlalchemy<2", "alembic<1.14", "cmaes<0.11",
                          "scipy"], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    # appended after the new environment's own packages, so its pins win; .pth files there run too
    (Path(purelib) / "zz_outer_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def test_optuna_sweeper_over_local_launcher(tmp_path, optuna_python):
    """hpctrain's task function returns its objective as a number: Optuna's sweeper can minimise it."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run([str(optuna_python), "-m", "hpctrain", "-m", "hydra/sweeper=optuna",
                           "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "hydra.sweeper.sampler.seed=0",
                           "lr=interval(0.0001,0.01)", "max_steps=10", "hydra/launcher=local",
                           f"hydra.sweep.dir={sweep}"], cwd=tmp_path, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = [json.loads((d / "metrics.json").read_text())["objective"]["value"] for d in _run_dirs(sweep)]
    assert len(values) == 2
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(min(values))


def test_the_median_pruner_leaves_small_studies_and_first_evals_alone():
    import optuna

    from hpctrain.search.space import parse
    from hpctrain.search.settings import Settings
    from hpctrain.search.study import build_pruner

    space, problems = parse(["lr=interval(0.001,0.1)"], None)
    assert not problems
    study = optuna.create_study(pruner=build_pruner(Settings(space=space, n_trials=6, n_workers=1,
                                                             first_eval_step=10)))
    for _ in range(4):  # four good trials finished
        t = study.ask()
        t.report(1.0, 10), t.report(1.0, 20)
        study.tell(t, 1.0)
    fifth = study.ask()
    fifth.report(100.0, 20)
    assert not fifth.should_prune()  # 4 finished trials: fewer than 5 to compare against
    study.tell(fifth, 1.0)
    sixth = study.ask()
    sixth.report(100.0, 10)
    assert not sixth.should_prune()  # its first eval: the warm-up
    sixth.report(100.0, 20)
    assert sixth.should_prune()


def test_tensorboard_puts_the_objective_and_the_losses_first(tmp_path):
    """HParams lists the objective, then the losses, then the other metrics; the Custom Scalars layout has the
    objective's category first, then the losses (train and val on one chart), read back from the event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar.layout_pb2 import Layout

    run_dir = tmp_path / "run"
    run_hpctrain(["objective.metric=val/accuracy", "objective.mode=max", "max_steps=20", "eval_every=10", "lr=1e-3",
                  f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    tags = [m.name.tag for m in _hparams_experiment(run_dir).metric_infos]
    assert tags == ["val/accuracy", "train/loss", "val/loss", "train/lr", "train/grad_norm"], tags
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    layout = Layout.FromString(acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    categories = [(c.title, [list(chart.multiline.tag) for chart in c.chart]) for c in layout.category]
    assert [title for title, _ in categories] == ["objective", "losses", "training", "throughput"]
    assert categories[0][1] == [["val/accuracy"]] and categories[1][1] == [["train/loss", "val/loss"]]
