"""A sweep of two points with a secret override (the README's form, ``${oc.env:...}``) runs to completed:
the trainer names its swept keys from its own overrides, never by parsing sweep.json's redacted copies."""

import json
import uuid
from pathlib import Path

import pytest

from cli_helpers import run_hpctrain
from hpctrain.core.errors import deterministic
from hpctrain.core.run import RunSpec
from slurm_helpers import cancel, job_id, metrics, wait_for

SECRET_ARGS = ["-m", "lr=1e-3,1e-4", "max_steps=3", "+wandb.api_key=${oc.env:WANDB_API_KEY}",
               "hydra.launcher.max_retries=0"]


def _completed(sweep: Path) -> dict:
    runs = json.loads((sweep / "sweep.json").read_text())["runs"].values()
    assert all("+wandb.api_key=<redacted>" in r["overrides"] for r in runs)  # what the trainer must not parse
    return {r["run_dir"]: metrics(sweep / r["run_dir"]).get("status") for r in runs}


def test_local_two_point_sweep_with_a_secret_override_completes(tmp_path):
    sweep = tmp_path / "sweep"
    secret = f"s-{uuid.uuid4().hex}"
    run_hpctrain(SECRET_ARGS + ["hydra/launcher=local", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                 env={"WANDB_API_KEY": secret}, timeout=300)
    assert _completed(sweep) == {"0_lr=0.001": "completed", "1_lr=0.0001": "completed"}


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_slurm_two_point_sweep_with_a_secret_override_completes(tmp_path):
    sweep = tmp_path / "sweep"
    run_hpctrain(SECRET_ARGS + ["hydra/launcher=slurm", f"hydra.sweep.dir={sweep}"], cwd=tmp_path,
                 env={"WANDB_API_KEY": f"s-{uuid.uuid4().hex}"}, timeout=120)
    job = job_id(sweep)
    try:
        ended = ("completed", "failed")
        wait_for(lambda: all(s in ended for s in _completed(sweep).values()), 240, "both runs to end")
        assert _completed(sweep) == {"0_lr=0.001": "completed", "1_lr=0.0001": "completed"}
    finally:
        cancel(job)


def test_a_redacted_spec_reads_as_text_and_a_parse_error_is_not_retried():
    spec = RunSpec(0, ("lr=0.1", "+wandb.api_key=<redacted>", "model@m=cnn", "~seed"), Path("/x/0"))
    assert spec.values() == {"lr": "0.1", "wandb.api_key": "<redacted>", "model": "cnn"}
    error = ("Traceback (most recent call last):\n  ...\nhydra.errors.OverrideParseException: mismatched input '<' "
             "expecting <EOF>\nSee https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details")
    assert deterministic(error)


def test_hparams_read_a_line_the_grammar_refuses_as_text():
    from hpctrain.train.hparams import swept_keys

    assert swept_keys(["lr=0.1", "+wandb.api_key=<redacted>"]) == {"lr": "0.1", "wandb.api_key": "<redacted>"}
