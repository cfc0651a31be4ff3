"""Checkpoints: weights_only=True both ways, the previous one kept, a torn last.pt skipped, and every
rank's RNG state saved and restored, also when the number of ranks changes between save and resume."""

import logging
import random
import sys

import numpy as np
import pytest
import torch

from trainer_helpers import compose, gloo_ranks

from hpctrain.train import checkpointer as checkpoint
from hpctrain.train.distributed import DistInfo
from hpctrain.train.trainer import Trainer

ARGS = ["max_steps=20", "ckpt_every=5", "log_every=5", "eval_every=0"]


def test_saved_checkpoints_load_with_weights_only_and_the_previous_is_kept(tmp_path):
    Trainer(compose(ARGS), tmp_path, DistInfo()).fit()
    ckpt_dir = tmp_path / "checkpoints"
    last = torch.load(ckpt_dir / "last.pt", weights_only=True)
    previous = torch.load(ckpt_dir / "previous.pt", weights_only=True)
    assert (last["step"], previous["step"]) == (20, 15)
    (rng,) = last["rng"]  # one entry per rank
    assert set(rng) == {"python", "numpy", "torch"}  # no "cuda" on a CPU run


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_torn_last_pt_falls_back_to_the_previous_one(tmp_path, caplog, cut):
    Trainer(compose(ARGS), tmp_path, DistInfo()).fit()
    last = tmp_path / "checkpoints" / "last.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2] if cut == "half" else b"")  # a write cut short
    with pytest.raises(Exception):
        torch.load(last, weights_only=True)

    with caplog.at_level(logging.INFO):
        resumed = Trainer(compose(["max_steps=30"] + ARGS[1:]), tmp_path, DistInfo())
    assert resumed.step == 15
    text = caplog.text
    assert "checkpoints/last.pt is unreadable" in text
    assert f"resumed from {tmp_path / 'checkpoints' / 'previous.pt'} at step 15" in text
    resumed.fit()
    assert torch.load(last, weights_only=True)["step"] == 30


def test_no_readable_checkpoint_starts_from_scratch(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    (ckpt_dir / "last.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    assert checkpoint.load(ckpt_dir / "last.pt") == (None, None)
    assert Trainer(compose(ARGS), tmp_path, DistInfo()).step == 0


def test_rng_state_round_trip_through_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # a cached gaussian in numpy's state too
    path = tmp_path / "rng.pt"
    torch.save({"rng": checkpoint.rng_state(torch.device("cpu")), "step": 0}, path)
    expected = (random.random(), np.random.randn(), torch.rand(3))
    checkpoint.set_rng_state(torch.load(path, weights_only=True)["rng"])
    got = (random.random(), np.random.randn(), torch.rand(3))
    assert expected[0] == got[0] and expected[1] == got[1] and torch.equal(expected[2], got[2])


# ----------------------------------------------------------------------- a different number of ranks
def _steps(trainer: Trainer) -> tuple:
    """Where the run started (0, or the step it resumed at) and where it ended."""
    start = trainer.step
    trainer.fit()
    return start, trainer.step


def _run(world: int, overrides: list, run_dir) -> dict:
    if world == 1:
        return {0: _steps(Trainer(compose(overrides), run_dir, DistInfo()))}
    return gloo_ranks(world, overrides, run_dir, _steps)


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_resume_with_a_different_number_of_ranks(tmp_path, first, second):
    common = ["batch_size=32", "log_every=5", "eval_every=0", "ckpt_every=5"]
    assert _run(first, common + ["max_steps=10"], tmp_path) == {r: (0, 10) for r in range(first)}
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert len(saved["rng"]) == first  # every rank's own state
    assert _run(second, common + ["max_steps=15"], tmp_path) == {r: (10, 15) for r in range(second)}
    assert len(torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["rng"]) == second


def test_the_requeue_call_survives_the_sigterm_the_requeue_itself_sends():
    """submitit's handler runs `scontrol requeue`, which makes Slurm SIGTERM every process of the job,
    scontrol too; the handler is called with SIGTERM ignored, which its children keep through exec. The
    stand-in for scontrol sends itself the SIGTERM: it finishes, and the caller's own handler is back after."""
    import signal
    import subprocess

    from hpctrain.job.preemption import requeue_with

    stand_in = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('done')"]
    with pytest.raises(subprocess.CalledProcessError) as plain:  # what submitit's check_call met before
        subprocess.check_call(stand_in, stdout=subprocess.DEVNULL)
    assert plain.value.returncode == -signal.SIGTERM

    seen = []
    mine = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        requeue_with(lambda signum, frame: seen.append((signum, subprocess.check_output(stand_in, text=True))),
                     signal.SIGUSR2)
        assert seen == [(signal.SIGUSR2, "done\n")]
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, mine)
