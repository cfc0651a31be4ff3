"""A stop signal to one rank of two: both ranks stop and checkpoint at the same step, one step after it.

The ranks agree through an asynchronous all-reduce of the flag started each step and read at the next
(hpctrain.train.distributed.AgreedFlag), not only at log steps: log_every is far from the signal here.
"""

import os
import signal

import torch

from trainer_helpers import gloo_ranks

SIGNAL_RANK, SIGNAL_AT = 1, 6
OVERRIDES = ["max_steps=20", "batch_size=64", "log_every=50", "eval_every=0", "ckpt_every=0"]


class Stopped(Exception):
    pass


class SignalOneRank:
    """Rank ``SIGNAL_RANK`` sends itself SIGUSR2 when asked at step ``SIGNAL_AT``; the handler raises the flag."""

    def __init__(self, rank: int) -> None:
        self.rank, self.requested, self.sent_at = rank, False, None

    def on_start(self, step: int) -> None:
        signal.signal(signal.SIGUSR2, self._got)

    def _got(self, signum, frame) -> None:
        self.requested = True

    def should_stop(self, step: int) -> bool:
        if self.rank == SIGNAL_RANK and step == SIGNAL_AT and self.sent_at is None:
            self.sent_at = step
            os.kill(os.getpid(), signal.SIGUSR2)
        return self.requested

    def on_stop(self, step: int) -> None:
        raise Stopped(step)

    def on_eval(self, step, metrics):
        return None

    def on_end(self, step, status) -> None:
        return None


def _stopped_at(trainer):
    """Fit with the hook; the step each rank stopped at (its on_stop), whether it saw the signal itself."""
    hook = SignalOneRank(trainer.info.rank)
    trainer.hooks.append(hook)
    try:
        trainer.fit()
    except Stopped as stop:
        return {"stopped": stop.args[0], "signalled": hook.sent_at}
    return {"stopped": None, "signalled": hook.sent_at}


def test_a_signal_to_one_rank_stops_both_at_the_same_step_within_one_step(tmp_path):
    run = tmp_path / "run"
    got = gloo_ranks(2, OVERRIDES, run, _stopped_at)
    assert got[SIGNAL_RANK]["signalled"] == SIGNAL_AT and got[1 - SIGNAL_RANK]["signalled"] is None
    assert got[0]["stopped"] == got[1]["stopped"], got
    assert SIGNAL_AT < got[0]["stopped"] <= SIGNAL_AT + 1, got  # far from a log step (log_every=50)
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == got[0]["stopped"]

    # the checkpoint resumes exactly: the same weights as a run never stopped
    gloo_ranks(2, OVERRIDES, run)
    gloo_ranks(2, OVERRIDES, tmp_path / "whole")
    resumed = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    assert resumed["step"] == whole["step"] == 20
    assert resumed["data"] == whole["data"]
    for key in whole["model"]:
        assert torch.equal(resumed["model"][key], whole["model"][key]), key
    for key in ("exp_avg", "exp_avg_sq"):
        for i, state in whole["optimizer"]["state"].items():
            assert torch.equal(resumed["optimizer"]["state"][i][key], state[key]), (i, key)
