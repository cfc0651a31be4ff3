"""Trainer semantics on one CPU process: accumulation, resume, precision, checkpoint contents."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import hpctrain_env, run_hpctrain
from trainer_helpers import compose, state_close

from hpctrain.distributed import DistInfo
from hpctrain.trainer import Trainer, micro_batch_size


def _train(tmp_path, name, overrides):
    trainer = Trainer(compose(overrides), tmp_path / name, DistInfo())
    trainer.fit()
    return trainer


def test_grad_accum_matches_one_big_batch(tmp_path):
    common = ["max_steps=25", "batch_size=64", "eval_every=0", "log_every=5"]
    one = _train(tmp_path, "accum1", common + ["grad_accum=1"])
    four = _train(tmp_path, "accum4", common + ["grad_accum=4"])
    assert four.micro_bs == 16 and one.micro_bs == 64
    assert state_close(one.raw_model.state_dict(), four.raw_model.state_dict(), atol=1e-5)
    # and it really trained: the weights moved away from the initial ones
    init = Trainer(compose(common), tmp_path / "init", DistInfo()).raw_model.state_dict()
    assert not state_close(init, one.raw_model.state_dict(), atol=1e-3)


def test_batch_must_divide():
    assert micro_batch_size(64, 2, 4) == 8
    with pytest.raises(ValueError, match="batch_size=60 must be divisible by world_size x grad_accum = 2 x 4"):
        micro_batch_size(60, 2, 4)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    trainer = _train(tmp_path, precision, ["max_steps=30", f"precision={precision}", "eval_every=0"])
    record = json.loads((tmp_path / precision / "metrics.json").read_text())
    assert record["status"] == "completed"
    assert record["metrics"]["train/loss"] < 2.0  # started at log(8) ~ 2.08
    assert trainer.scaler.is_enabled() == (precision == "fp16")


def test_checkpoint_contents(tmp_path):
    _train(tmp_path, "ck", ["max_steps=10", "compile=false"])
    state = torch.load(tmp_path / "ck" / "checkpoints" / "last.pt", weights_only=True)
    for key in ("model", "optimizer", "scheduler", "scaler", "step", "rng", "data"):
        assert key in state
    assert state["step"] == 10
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])  # unwrapped, uncompiled
    assert len(state["rng"]) == 1 and set(state["rng"][0]) >= {"python", "numpy", "torch"}  # one per rank


def test_resume_after_kill_is_bit_exact(tmp_path):
    """Kill a run after a checkpoint, start it again, compare with a run that never stopped."""
    args = ["max_steps=3000", "ckpt_every=100", "log_every=50", "eval_every=500", "model=mlp", "model.hidden=64"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run_hpctrain(args + [f"hydra.run.dir={whole}"], cwd=tmp_path)

    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={broken}"], cwd=tmp_path,
                            env=hpctrain_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = broken / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and not ckpt.exists():
        time.sleep(0.01)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(ckpt, weights_only=True)["step"]
    assert 0 < killed_at < 3000, f"the run was not interrupted (checkpoint at step {killed_at})"

    run_hpctrain(args + [f"hydra.run.dir={broken}"], cwd=tmp_path)
    a = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["step"] == b["step"] == 3000
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert "resumed from" in (broken / "hpctrain.log").read_text()


def test_compile_trains_and_saves_the_uncompiled_module(tmp_path):
    trainer = _train(tmp_path, "compiled", ["max_steps=8", "compile=true", "eval_every=0", "log_every=4"])
    assert trainer.model is not trainer.raw_model  # the compiled wrapper
    state = torch.load(tmp_path / "compiled" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 8
    assert set(state["model"]) == set(trainer.raw_model.state_dict())
    assert not any("_orig_mod" in k for k in state["model"])
