"""Checkpoints: weights_only=True both ways, the previous one kept, a torn last.pt skipped, and every
rank's RNG state saved and restored, also when the number of ranks changes between save and resume."""

import logging
import random
import sys

import numpy as np
import pytest
import torch

from trainer_helpers import compose, gloo_ranks, state_close

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


# ----------------------------------------------------------------------- the Checkpointer itself
class _Part:
    """A Stateful stand-in: the trainer's part (a step) or the data position."""

    def __init__(self, **state):
        self.state = dict(state)

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = {k: state[k] for k in self.state}


def _checkpointer(tmp_path, every):
    trainer, data = _Part(step=0), _Part(epoch=0, batch_in_epoch=0)
    return checkpoint.Checkpointer(tmp_path / "checkpoints" / "last.pt", every, DistInfo(), trainer, data), trainer


def test_the_checkpointer_owns_the_interval(tmp_path):
    ckpt, trainer = _checkpointer(tmp_path, every=5)
    saved = []
    for step in range(1, 13):
        trainer.state["step"] = step
        if ckpt.save(step):
            saved.append(step)
    assert saved == [5, 10]
    trainer.state["step"] = 12
    assert ckpt.save(12, force=True) and not ckpt.save(12, force=True)  # forced once; the same step not twice
    ckpt_dir = tmp_path / "checkpoints"
    assert [torch.load(ckpt_dir / name, weights_only=True)["step"] for name in ("last.pt", "previous.pt")] == [12, 10]
    never, _ = _checkpointer(tmp_path / "never", every=0)
    assert not any(never.save(s) for s in range(1, 20)) and not (tmp_path / "never" / "checkpoints").exists()


def test_the_checkpointer_loads_previous_pt_when_last_pt_is_torn(tmp_path, caplog):
    ckpt, trainer = _checkpointer(tmp_path, every=1)
    for step in (1, 2):
        trainer.state["step"] = step
        ckpt.save(step)
    last = tmp_path / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:100])  # a write cut short
    (tmp_path / "checkpoints" / ".last.pt.tmp-123").write_bytes(b"half")  # and a save killed half-way
    fresh, restored = _checkpointer(tmp_path, every=1)
    with caplog.at_level(logging.INFO):
        assert fresh.load() == 1
    assert restored.state == {"step": 1}
    assert "checkpoints/last.pt is unreadable" in caplog.text
    assert not (tmp_path / "checkpoints" / ".last.pt.tmp-123").exists()


class _StopAt:
    """A preemption stand-in: asks to stop at ``step``; its hand-over ends the process (here: an exception)."""

    class Gone(Exception):
        pass

    def __init__(self, step):
        self.step = step

    def on_start(self, step):
        pass

    def should_stop(self, step):
        return step >= self.step

    def on_stop(self, step):
        raise self.Gone(step)

    def on_eval(self, step, metrics):
        return None

    def on_end(self, step, status):
        pass


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_stopped_and_resumed_equals_an_uninterrupted_run(tmp_path, grad_accum):
    """Dropout draws from the RNG every step, and batches are fetched ahead: a run stopped mid-way (not at a
    checkpoint or log step) and resumed ends with the very weights of one that never stopped."""
    args = ["max_steps=40", "ckpt_every=15", "log_every=7", "eval_every=0", f"grad_accum={grad_accum}",
            "model._target_=user_models.SlowDropout", "+model.delay_s=0"]
    whole = Trainer(compose(args), tmp_path / "whole", DistInfo())
    whole.fit()
    broken = Trainer(compose(args), tmp_path / "broken", DistInfo(), hooks=[_StopAt(22)])
    with pytest.raises(_StopAt.Gone) as gone:
        broken.fit()
    stopped_at = gone.value.args[0]
    assert 22 < stopped_at < 40 and stopped_at % 7 and stopped_at % 15
    resumed = Trainer(compose(args), tmp_path / "broken", DistInfo())
    assert resumed.step == stopped_at
    resumed.fit()
    assert state_close(whole.raw_model.state_dict(), resumed.raw_model.state_dict(), atol=0)
    (a,), (b,) = (torch.load(t.run_dir / "checkpoints" / "last.pt", weights_only=True)["rng"] for t in (whole, resumed))
    assert torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"]  # the same RNG stream to the end
