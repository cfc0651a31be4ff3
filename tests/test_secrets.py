"""Secrets are left out of what hpctrain writes for people to read, by a precise rule on names."""

import json
import uuid
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from cli_helpers import run_hpctrain, skipped
from hpctrain.core.redact import (REDACTED, is_secret_key, redact_argv, redact_config, redact_env,
                                  redact_overrides, secret_hint, secret_keys)

SECRET_NAMES = ["wandb.api_key", "hf_token", "HF_TOKEN", "db.password", "aws_secret_access_key", "token", "apikey",
                "my.secret", "passwd", "gcp.credentials", "credential", "ssh.private_key", "s3.access_key",
                "secret_key", "auth", "+wandb.api_key", "~hf_token", "api-key", "WANDB_API_KEY", "github.oauth_token"]
NOT_SECRET_NAMES = ["max_tokens", "tokenizer.pad_token", "eos_token", "num_tokens", "monkey", "keys", "tokenizer", "key_dim", "model.hidden", "author",
                    "token_dim", "secrets_dir", "passwords_file", "lr", "api_key_file"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_key(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_names_that_are_not_secret(name):
    assert not is_secret_key(name)


def test_overrides_keep_their_keys_and_lose_only_secret_values():
    given = ["+wandb.api_key=abc", "hf_token=\"quoted value\"", "++db.password='x y'", "+token=a,b",
             "max_tokens=5", "+monkey=3", "lr=0.1", "model=cnn", "~auth", "+auth=${oc.env:MY_TOKEN}",
             "hydra.launcher.env={HF_TOKEN: abc, OMP_NUM_THREADS: 4}", "hydra.launcher.env.WANDB_API_KEY=k"]
    assert redact_overrides(given) == [
        "+wandb.api_key=<redacted>", "hf_token=<redacted>", "++db.password=<redacted>", "+token=<redacted>",
        "max_tokens=5", "+monkey=3", "lr=0.1", "model=cnn", "~auth", "+auth=<redacted>",
        "hydra.launcher.env={HF_TOKEN: <redacted>, OMP_NUM_THREADS: 4}", "hydra.launcher.env.WANDB_API_KEY=<redacted>"]
    assert redact_overrides(redact_overrides(given)) == redact_overrides(given)  # a rewrite of sweep.json


def test_argv_flags_and_overrides():
    argv = ["/usr/bin/python", "-m", "hpctrain", "-m", "--token", "abc", "--api-key=abc", "--config-name=x",
            "+hf_token=abc", "+max_tokens=5"]
    assert redact_argv(argv) == ["/usr/bin/python", "-m", "hpctrain", "-m", "--token", REDACTED,
                                 f"--api-key={REDACTED}", "--config-name=x", f"+hf_token={REDACTED}", "+max_tokens=5"]
    assert redact_env({"HF_TOKEN": "abc", "PYTHONPATH": "/x"}) == {"HF_TOKEN": REDACTED, "PYTHONPATH": "/x"}


def test_config_copies_redact_secret_keys_and_values_read_from_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-env")
    monkeypatch.setenv("DATA_ROOT", "/data")
    cfg = OmegaConf.create({"max_tokens": 5, "monkey": "george", "keys": [1, 2], "tokenizer": "gpt2",
                            "wandb": {"api_key": "abc", "project": "p"}, "hub": "${oc.env:HF_TOKEN}",
                            "data": "${oc.env:DATA_ROOT}", "header": "Bearer ${wandb.api_key}",
                            "db": {"credentials": {"user": "u", "pass": "p"}}})
    assert redact_config(cfg) == {"max_tokens": 5, "monkey": "george", "keys": [1, 2], "tokenizer": "gpt2",
                                  "wandb": {"api_key": REDACTED, "project": "p"}, "hub": REDACTED,
                                  "data": "/data", "header": REDACTED, "db": {"credentials": REDACTED}}


def test_reproduce_hint_and_run_names_leave_secrets_out():
    hint = secret_hint(["+wandb.api_key=<redacted>", "lr=0.1"])
    assert hint and "export WANDB_API_KEY=" in hint and "+wandb.api_key='${oc.env:WANDB_API_KEY}'" in hint
    assert secret_hint(["lr=0.1"]) is None
    assert secret_keys([["+wandb.api_key=a", "lr=1"], ["+wandb.api_key=a", "hf_token=b"]]) == ["wandb.api_key",
                                                                                               "hf_token"]


def test_hparams_swept_keys_redacted():
    from hpctrain.train.hparams import swept_keys

    assert swept_keys(["+wandb.api_key=abc", "+max_tokens=5"]) == {"wandb.api_key": REDACTED, "max_tokens": "5"}


def _tb_hparams(run_dir: Path) -> dict:
    """The run's HParams session values, read with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    out = {}
    for content in acc.PluginTagToContent("hparams").values():
        data = HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for name, value in data.session_start_info.hparams.items():
                kind = value.WhichOneof("kind")
                out[name] = getattr(value, kind) if kind else None
    return out


def test_a_secret_override_is_written_nowhere_hpctrain_writes(tmp_path):
    secret = f"sekrit123-{uuid.uuid4().hex}"  # made here: the code snapshot in the sweep dir holds this file
    sweep = tmp_path / "sweep"
    args = ["-m", "max_steps=5", "+max_tokens=5", "hydra/launcher=local", f"hydra.sweep.dir={sweep}"]
    first = run_hpctrain(args + [f"+wandb.api_key={secret}"], cwd=tmp_path)
    report = run_hpctrain(["report", str(sweep)], cwd=tmp_path)
    assert secret not in first.stdout + first.stderr + report.stdout + report.stderr

    (run_dir,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert "api_key" not in run_dir.name  # a run dir's name is its identity: no secret in it
    # Hydra's own files hold the overrides as given; the pickles are the job's input and its return value
    hydras = {run_dir / ".hydra" / n for n in ("overrides.yaml", "config.yaml", "hydra.yaml")}
    hydras.add(sweep / "multirun.yaml")
    holding = {p for p in sweep.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()}
    assert {p for p in holding - hydras if p.suffix != ".pkl"} == set()
    assert {p.parent.name for p in holding if p.suffix == ".pkl"} <= {".hpctrain", ".submitit"}
    assert (run_dir / ".hydra" / "overrides.yaml").read_bytes().count(secret.encode())  # the check can see it

    (record,) = sweep.glob(".hpctrain/submission-*/record.json")
    argv = json.loads(record.read_text())["argv"]
    assert "+wandb.api_key=<redacted>" in argv and "+max_tokens=5" in argv
    (entry,) = json.loads((sweep / "sweep.json").read_text())["runs"].values()
    assert "+wandb.api_key=<redacted>" in entry["overrides"] and "+max_tokens=5" in entry["overrides"]
    results = json.loads((sweep / "results.json").read_text())
    md = (sweep / "report.md").read_text()
    for text in (json.dumps(results), md, report.stdout):
        assert "<redacted>" in text and "max_tokens=5" in text
    assert "export WANDB_API_KEY=" in md and "export WANDB_API_KEY=" in report.stdout  # where the secret goes
    assert "wandb.api_key" not in results["best"]["values"] and "metric_vs_wandb.api_key.png" not in results["plots"]

    hparams = _tb_hparams(run_dir)
    assert hparams["max_tokens"] == 5 and hparams["wandb.api_key"] == REDACTED
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["config"]["max_tokens"] == 5 and state["config"]["wandb"]["api_key"] == REDACTED

    # the run's identity does not depend on the secret's value: a rerun with another one skips it
    again = run_hpctrain(args + [f"+wandb.api_key=other-{uuid.uuid4().hex}"], cwd=tmp_path)
    assert run_dir.name in skipped(again.stdout), again.stdout
