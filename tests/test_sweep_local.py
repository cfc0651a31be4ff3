"""The README's sweep, end to end, on the local executor."""

import json
import os
import subprocess
import sys

from cli_helpers import hpctrain_env, run_hpctrain, tb_scalars


def test_readme_sweep_on_local_executor(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e-3,1e-4", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    run_dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in run_dirs] == ["0_lr=0.001", "1_lr=0.0001"]
    for run_dir in run_dirs:
        record = json.loads((run_dir / "metrics.json").read_text())
        assert record["status"] == "completed"
        assert record["step"] == 200
        losses = tb_scalars(run_dir, "train/loss")
        assert len(losses) == 20  # log_every=10 over 200 steps
        assert losses[-1] < 0.8 * losses[0], f"loss did not go down in {run_dir.name}: {losses}"
        assert record["metrics"]["train/loss"] == losses[-1]
        assert (run_dir / "checkpoints" / "last.pt").is_file()
        assert (run_dir / ".hydra" / "config.yaml").is_file()
        # the run's hyperparameters with its final metrics, for TensorBoard's HParams view
        hparams = _hparams_tags(run_dir)
        assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= hparams
        assert "train/loss" in {m.name.tag for m in _experiment(run_dir).metric_infos}
    # the summary: one short line per run with its swept values, status and final objective
    for idx, run_dir in enumerate(run_dirs):
        final = json.loads((run_dir / "metrics.json").read_text())["metrics"]["val/loss"]
        (row,) = [r.split() for r in proc.stdout.splitlines() if r.strip().startswith(f"#{idx} ")]
        assert row == [f"#{idx}", run_dir.name.split("_", 1)[1], "completed", f"val/loss={final:.4g}"], row


def _experiment(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment


def _hparams_tags(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return set(acc.PluginTagToContent("hparams"))


def test_single_run_in_process(tmp_path):
    run_dir = tmp_path / "run"
    run_hpctrain(["max_steps=20", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "completed" and record["step"] == 20


def test_default_launcher_is_slurm_with_sbatch_else_local(tmp_path):
    args = ["-m", "max_steps=1", "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"]
    no_slurm = tmp_path / "bin"
    no_slurm.mkdir()
    proc = run_hpctrain(args, cwd=tmp_path, env={"PATH": str(no_slurm)})
    assert "hpctrain: launcher local (no sbatch on PATH" in proc.stderr
    (no_slurm / "sbatch").symlink_to("/bin/true")
    proc = run_hpctrain(args, cwd=tmp_path, env={"PATH": f"{no_slurm}:/usr/bin:/bin"})
    assert "hpctrain: launcher slurm (sbatch found on PATH" in proc.stderr
    assert "#SBATCH" in proc.stdout  # the Slurm launcher's dry run prints the script


def test_local_runs_in_parallel_up_to_max_parallel_and_share_the_cores(tmp_path):
    """Two CPU runs at a time: each gets half of this machine's cores as torch threads (torch's default is
    every core for each), when the user has not set OMP_NUM_THREADS (the tests set it: unset here)."""
    dump = tmp_path / "dump"
    dump.mkdir()
    env = hpctrain_env()
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "-m", "seed=0,1,2", "max_steps=60",
                           "model._target_=user_models.ThreadCount", f"+model.dump_dir={dump}", "hydra/launcher=local",
                           "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={tmp_path / 's'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [line.split()[0] for line in proc.stdout.splitlines() if line.strip().startswith(("started", "completed"))]
    assert events[:3] == ["started", "started", "completed"]  # two at once, the third waits for a free slot
    assert events.count("started") == 3 and "2 run(s) on this machine" not in proc.stdout
    assert "3 run(s) on this machine, 2 at a time" in proc.stdout
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert sorted(p.read_text().split() for p in dump.glob("threads-*.txt")) == [[share, share]] * 3


def test_sweep_from_a_file_with_command_line_values(tmp_path):
    """conf/sweep/lr_seed.yaml sweeps lr x seed; a command-line value replaces the file's seeds."""
    proc = run_hpctrain(["-m", "+sweep=lr_seed", "seed=5,6,7", "hydra/launcher=slurm", "hydra.launcher.dry_run=true",
                         f"hydra.sweep.dir={tmp_path / 's'}"], cwd=tmp_path)
    runs = proc.stdout.split("runs (")[1].splitlines()[1:-1]  # the run list after the sbatch script
    names = [line.split()[-1].rsplit("/", 1)[-1] for line in runs]
    assert names == [f"{i}_lr={lr},seed={seed}" for i, (lr, seed) in
                     enumerate((lr, seed) for lr in ("0.001", "0.003") for seed in (5, 6, 7))]


def test_sweep_over_a_config_group(tmp_path):
    """model=mlp,cnn on images: each run composes its own group option (config, model weights, run dir);
    the MLP takes the images flattened (data.num_features follows channels and image_size)."""
    import torch
    from omegaconf import OmegaConf

    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "model=mlp,cnn", "data=images", "data.image_size=8", "max_steps=5", "eval_every=0",
                  "hydra/launcher=local", "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    mlp, cnn = sweep / "0_model=mlp", sweep / "1_model=cnn"
    configs = [OmegaConf.load(d / ".hydra" / "config.yaml") for d in (mlp, cnn)]
    assert [c.model._target_ for c in configs] == ["hpctrain.train.models.mlp.MLP", "hpctrain.train.models.cnn.CNN"]
    weights = [torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"] for d in (mlp, cnn)]
    assert tuple(weights[0]["net.0.weight"].shape) == (256, 1 * 8 * 8) and "features.0.weight" not in weights[0]
    assert tuple(weights[1]["features.0.weight"].shape) == (32, 1, 3, 3) and "net.0.weight" not in weights[1]
    assert [json.loads((d / "metrics.json").read_text())["status"] for d in (mlp, cnn)] == ["completed"] * 2



def test_hparams_of_a_2d_sweep_hold_exactly_the_swept_keys_and_the_config_the_rest(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep = tmp_path / "sweep"
    run_hpctrain(["-m", "lr=1e-3,1e-2", "model.hidden=8,16", "max_steps=5", "eval_every=5", "hydra/launcher=local",
                  f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    run_dirs = sorted((p for p in sweep.iterdir() if (p / "metrics.json").is_file()), key=lambda p: p.name)
    assert len(run_dirs) == 4
    for run_dir in run_dirs:
        exp = _experiment(run_dir)
        assert [(h.name, h.differs) for h in exp.hparam_infos] == [("lr", True), ("model.hidden", True)]
        assert [m.name.tag for m in exp.metric_infos][0] == "val/loss"  # the objective first
        acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
        acc.Reload()
        (config,) = acc.Tensors("config/text_summary")
        assert "max_steps: 5" in config.tensor_proto.string_val[0].decode()
