"""The Python API against Ray Tune's ResultGrid: best(metric, mode), curves() as a long DataFrame, Run.config,
Run.checkpoint (the newest complete one, a torn last.pt skipped), short reprs, launch() errors as one line."""

import shutil

import pandas as pd
import pytest
from omegaconf import DictConfig

from cli_helpers import hpctrain_env

import hpctrain
from hpctrain.core.state import State
from hpctrain.review.sweep import SweepError


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    where = tmp_path_factory.mktemp("api")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in hpctrain_env().items():
            mp.setenv(key, value)
        mp.chdir(where)
        sweep = hpctrain.launch(["lr=1e-3,1e-1", "max_steps=20", "eval_every=10", "ckpt_every=10"],
                                launcher="local", sweep_dir=where / "s")
        finished = sweep.wait(poll_s=0.5, timeout_s=300)
    assert [r.state for r in finished.runs] == [State.COMPLETED, State.COMPLETED]
    return finished


def test_best_takes_a_metric_and_a_mode(done):
    losses = {r.name: r.metrics["val/loss"] for r in done.runs}
    assert done.best().name == min(losses, key=losses.get)
    assert done.best("val/loss", "max").name == max(losses, key=losses.get)
    assert done.best(metric="val/loss").name == min(losses, key=losses.get)  # the objective's own direction
    accuracy = {r.name: r.metrics["val/accuracy"] for r in done.runs}
    assert done.best("val/accuracy").metrics["val/accuracy"] == max(accuracy.values())  # guessed: accuracy up
    assert done.best("no/such") is None
    with pytest.raises(ValueError):
        done.best("val/loss", "sideways")


def test_curves_is_a_long_dataframe(done):
    frame = done.curves("train/loss")
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["run", "step", "value"]
    assert len(frame) == 4 and sorted(set(frame["run"])) == sorted(r.name for r in done.runs)
    best = done.best()
    mine = frame[frame["run"] == best.name]
    assert list(mine["step"]) == [10, 20] and list(mine["value"]) == [v for _, v in done.curve_points("train/loss")[best.name]]


def test_a_runs_config_is_its_composed_dictconfig(done):
    config = done.runs[1].config
    assert isinstance(config, DictConfig) and config.lr == 0.1 and config.max_steps == 20


def test_a_runs_checkpoint_is_the_newest_complete_one(done, tmp_path):
    run = done.runs[0]
    assert run.checkpoint == run.run_dir / "checkpoints" / "last.pt"
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    last = copy / "checkpoints" / "last.pt"
    assert (copy / "checkpoints" / "previous.pt").is_file()
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # torn: a save killed half-way
    from dataclasses import replace

    moved = replace(run, run_dir=copy)
    assert moved.checkpoint == copy / "checkpoints" / "previous.pt"
    (copy / "checkpoints" / "previous.pt").unlink()
    assert moved.checkpoint is None
    assert replace(run, run_dir=None).checkpoint is None and replace(run, run_dir=None).config is None


def test_reprs_are_short(done):
    assert len(repr(done)) < 200 and "2 completed" in repr(done) and "val/loss=" in repr(done)
    assert all(len(repr(r)) < 120 and r.name in repr(r) for r in done.runs)


def test_a_bad_key_is_one_line_and_leaves_no_sweep_dir(tmp_path, monkeypatch):
    for key, value in hpctrain_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SweepError) as caught:
        hpctrain.launch(["lrr=1"], launcher="local")
    message = str(caught.value)
    assert "\n" not in message and "lrr" in message and "Traceback" not in message, message
    assert not (tmp_path / "multirun").exists(), list(tmp_path.rglob("*"))
    with pytest.raises(SweepError) as caught:
        hpctrain.launch(["batch_size=7", "grad_accum=2"], launcher="local", sweep_dir=tmp_path / "bad")
    assert "\n" not in str(caught.value) and "batch_size=7" in str(caught.value)
    assert not (tmp_path / "bad").exists()
