"""A loss that goes to NaN/Inf ends the run `failed` with one line at the next log step, not retried."""

import math

import pytest

from cli_helpers import run_hpctrain
from slurm_helpers import metrics, record_kinds, run_dirs

from hpctrain.core.errors import deterministic
from hpctrain.train.nonfinite import NonFiniteGuard, NonFiniteLossError


def test_the_first_nonfinite_log_step_fails_and_says_the_last_finite_loss():
    guard = NonFiniteGuard(0)
    guard.check(10, 2.5, 1e-3)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 20; lr=0\.001, last finite loss 2\.5 at step 10"):
        guard.check(20, math.nan, 1e-3)


def test_max_nonfinite_allows_that_many_log_steps_in_a_row():
    guard = NonFiniteGuard(2)
    guard.check(10, math.inf, 1.0)
    guard.check(20, math.nan, 1.0)
    guard.check(30, 1.0, 1.0)  # finite again: the count starts over
    guard.check(40, math.nan, 1.0)
    guard.check(50, math.nan, 1.0)
    with pytest.raises(NonFiniteLossError, match="loss is inf at step 60"):
        guard.check(60, math.inf, 1.0)


def test_a_diverged_run_is_not_retried():
    assert deterministic("hpctrain.train.nonfinite.NonFiniteLossError: loss is nan at step 10; lr=1e+06, "
                         "no finite loss logged before (max_nonfinite=0)")


def test_lr_1e6_fails_at_its_first_log_step_and_is_not_retried(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "lr=1e6,1e-3", "max_steps=300", "log_every=10", "eval_every=0",
                         "hydra/launcher=local", "hydra.launcher.max_retries=2", f"hydra.sweep.dir={sweep}"],
                        cwd=tmp_path, check=False)
    assert proc.returncode != 0
    diverged, fine = run_dirs(sweep)
    record = metrics(diverged)
    assert record["status"] == "failed"
    assert "NonFiniteLossError: loss is nan at step 10; lr=1e+06" in record["error"], record["error"]
    assert record["step"] <= 10  # within one log interval of the first NaN, not 300 steps of NaN
    assert "retrying" not in record_kinds(diverged)
    assert metrics(fine)["status"] == "completed"


def test_max_nonfinite_is_checked_on_the_login_node(tmp_path):
    proc = run_hpctrain(["-m", "max_nonfinite=-1", "hydra/launcher=local", "hydra.launcher.dry_run=true",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "max_nonfinite=-1: expected an integer >= 0" in proc.stderr + proc.stdout
