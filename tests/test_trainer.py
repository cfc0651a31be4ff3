"""Trainer semantics on one CPU process: accumulation, resume, precision, checkpoint contents."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from cli_helpers import hpctrain_env, run_hpctrain, tb_scalars
from trainer_helpers import compose, state_close

from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer, micro_batch_size


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


@pytest.fixture(scope="module")
def fp32_losses(tmp_path_factory):
    """The reference: train/loss at steps 10, 20, 30 of the same run in fp32."""
    run = tmp_path_factory.mktemp("fp32")
    _train(run, "fp32", ["max_steps=30", "eval_every=0", "log_every=10", "precision=32"])
    return tb_scalars(run / "fp32", "train/loss")


def _first_linear(trainer) -> torch.nn.Linear:
    return next(m for m in trainer.raw_model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_runs_under_autocast_and_tracks_fp32(tmp_path, fp32_losses, precision, dtype):
    trainer = Trainer(compose(["max_steps=30", "eval_every=0", "log_every=10", f"precision={precision}"]),
                      tmp_path / precision, DistInfo())
    seen = []
    _first_linear(trainer).register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    trainer.fit()
    assert seen and set(seen) == {dtype}, set(seen)  # the forward really ran in the low precision
    record = json.loads((tmp_path / precision / "metrics.json").read_text())
    assert record["status"] == "completed"
    losses = tb_scalars(tmp_path / precision, "train/loss")
    assert losses == pytest.approx(fp32_losses, abs=0.01), (losses, fp32_losses)
    assert losses[-1] < 0.7 * losses[0]  # and it trained
    assert trainer.scaler.is_enabled() == (precision == "fp16")


def test_fp16_scaler_backs_off_on_overflow_and_the_step_is_skipped(tmp_path):
    """A scale of 2**40 overflows fp16 gradients: the scaler halves it and skips the step (weights kept)."""
    trainer = Trainer(compose(["max_steps=1", "eval_every=0", "log_every=1", "precision=fp16"]),
                      tmp_path / "fp16", DistInfo())
    trainer.scaler.load_state_dict({**trainer.scaler.state_dict(), "scale": 2.0 ** 40})
    before = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
    trainer.fit()
    assert trainer.scaler.get_scale() == 2.0 ** 39  # backoff_factor 0.5 after the overflow
    assert state_close(before, trainer.raw_model.state_dict(), atol=0)  # the optimizer step was skipped


def test_checkpoint_contents(tmp_path):
    _train(tmp_path, "ck", ["max_steps=10", "compile=false"])
    state = torch.load(tmp_path / "ck" / "checkpoints" / "last.pt", weights_only=True)
    for key in ("model", "optimizer", "scheduler", "scaler", "step", "rng", "data"):
        assert key in state
    assert state["step"] == 10
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state["model"])  # unwrapped, uncompiled
    assert len(state["rng"]) == 1 and set(state["rng"][0]) >= {"python", "numpy", "torch"}  # one per rank


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_after_kill_is_bit_exact(tmp_path, num_workers):
    """Kill a run after a checkpoint, start it again, compare with a run that never stopped.

    The model has dropout (the RNG state must come back) and sleeps 10 ms a step, so 300 steps leave time
    to kill it between checkpoints; with num_workers > 0 the DataLoader's workers must resume the data too.
    """
    args = ["max_steps=300", "ckpt_every=20", "log_every=10", "eval_every=50", "model._target_=user_models.SlowDropout",
            f"num_workers={num_workers}"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *args, f"hydra.run.dir={broken}"], cwd=tmp_path,
                            env=hpctrain_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = broken / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and not ckpt.exists() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(ckpt, weights_only=True)["step"]
    assert 0 < killed_at < 300, f"the run was not interrupted (checkpoint at step {killed_at})"

    _train(tmp_path, "whole", args)  # in this process: one interpreter start less
    run_hpctrain(args + [f"hydra.run.dir={broken}"], cwd=tmp_path)  # the resume, as a user starts it
    a = torch.load(whole / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["step"] == b["step"] == 300
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert f"at step {killed_at}" in (broken / "hpctrain.log").read_text()
    assert tb_scalars(whole, "val/loss") == tb_scalars(broken, "val/loss")  # evals after the resume: same values


def test_compile_trains_and_saves_the_uncompiled_module(tmp_path):
    trainer = _train(tmp_path, "compiled", ["max_steps=8", "compile=true", "eval_every=0", "log_every=4"])
    assert trainer.model is not trainer.raw_model  # the compiled wrapper
    state = torch.load(tmp_path / "compiled" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 8
    assert set(state["model"]) == set(trainer.raw_model.state_dict())
    assert not any("_orig_mod" in k for k in state["model"])


def test_lr_schedule_is_linear_warmup_then_cosine_to_the_floor(tmp_path):
    import math

    _train(tmp_path, "lr", ["max_steps=30", "warmup_steps=5", "min_lr_ratio=0.1", "lr=0.01", "log_every=1",
                            "eval_every=0"])
    logged = tb_scalars(tmp_path / "lr", "train/lr")  # logged after each step: the lr of the next step
    expected = []
    for step in range(1, 31):  # written out here, not taken from the trainer
        if step < 5:
            factor = (step + 1) / 5
        else:
            factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 5) / 25)))
        expected.append(0.01 * factor)
    assert logged == pytest.approx(expected, rel=1e-6)
    assert logged[-1] == pytest.approx(0.001)  # the floor: lr x min_lr_ratio


def test_grad_clip_bounds_the_update_and_logs_the_norm_before_clipping(tmp_path):
    trainer = Trainer(compose(["max_steps=10", "grad_clip=0.05", "log_every=1", "eval_every=0", "lr=0.1"]),
                      tmp_path / "clip", DistInfo())
    at_step = []

    def norm_at_step(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        at_step.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    trainer.optimizer.register_step_pre_hook(norm_at_step)
    trainer.fit()
    logged = tb_scalars(tmp_path / "clip", "train/grad_norm")
    assert len(at_step) == len(logged) == 10
    assert max(logged) > 0.05  # the gradients were larger than the clip...
    for before, applied in zip(logged, at_step):  # ...and the optimizer saw them clipped to it
        assert applied == pytest.approx(min(before, 0.05), rel=1e-4), (before, applied)
