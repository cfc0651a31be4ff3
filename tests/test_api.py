"""The Python API: hpctrain.launch() submits and returns a Sweep, hpctrain.load() reads one back as data."""

import json
import os
import subprocess
import sys
import time

import pytest

from cli_helpers import hpctrain_env

import hpctrain
from hpctrain.core.state import State
from hpctrain.review.sweep import SweepError


def _in_env(monkeypatch, cwd):
    for key, value in hpctrain_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(cwd)


def test_a_local_launch_returns_at_once_and_load_reads_it_back(tmp_path, monkeypatch):
    _in_env(monkeypatch, tmp_path)
    sweep = hpctrain.launch(["lr=1e-3,1e-2", "max_steps=20", "eval_every=10"], launcher="local",
                            sweep_dir=tmp_path / "s")
    assert sweep.process is not None and len(sweep.runs) == 2
    done = sweep.wait(poll_s=0.5, timeout_s=300)
    assert [r.state for r in done.runs] == [State.COMPLETED, State.COMPLETED]
    assert done.swept == ["lr"] and [r.params for r in done.runs] == [{"lr": 0.001}, {"lr": 0.01}]
    truth = {r.idx: json.loads((r.run_dir / "metrics.json").read_text()) for r in done.runs}
    assert done.objective_metric == "val/loss"
    best = done.best()
    assert best.objective == min(t["metrics"]["val/loss"] for t in truth.values())
    frame = done.to_pandas()
    assert list(frame["lr"]) == [0.001, 0.01] and list(frame["state"]) == ["completed", "completed"]
    assert list(frame["val/loss"]) == [truth[i]["metrics"]["val/loss"] for i in (0, 1)]
    # the local launcher's cost: wall time x GPUs (none here), from the runs' own records, marked as such
    assert all(r.cost.estimated and r.cost.gpu_hours == 0 and r.cost.wall_s > 0 for r in done.runs)
    curves = done.curve_points("train/loss")
    assert sorted(curves) == [r.name for r in done.runs] and [s for s, _ in curves[best.name]] == [10, 20]
    table = hpctrain.compare([tmp_path / "s", tmp_path / "s"])
    assert len(table) == 4 and list(table.columns[:2]) == ["sweep", "index"]


def test_bad_input_raises_the_launchers_line_and_a_torn_file_is_a_problem_not_a_crash(tmp_path, monkeypatch):
    _in_env(monkeypatch, tmp_path)
    with pytest.raises(SweepError, match="batch_size=7"):
        hpctrain.launch(["batch_size=7", "grad_accum=2"], launcher="local", sweep_dir=tmp_path / "bad")
    with pytest.raises(SweepError, match="no such directory"):
        hpctrain.load(tmp_path / "nowhere")
    sweep = hpctrain.launch(["lr=1e-3", "max_steps=5"], launcher="local", sweep_dir=tmp_path / "s").wait(0.5, 300)
    (sweep.runs[0].run_dir / "metrics.json").write_text('{"status": "compl')  # torn
    again = hpctrain.load(tmp_path / "s")
    assert len(again.runs) == 1 and again.runs[0].metrics == {}


def test_the_api_imports_no_torch(tmp_path):
    code = "import sys, hpctrain; hpctrain.load; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    proc = subprocess.run([sys.executable, "-c", code], env=hpctrain_env(), capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.slurm
def test_a_slurm_launch_returns_once_queued_and_its_cost_comes_from_accounting(slurm_cluster, tmp_path, monkeypatch):
    _in_env(monkeypatch, tmp_path)
    start = time.monotonic()
    sweep = hpctrain.launch(["lr=1e-3,1e-2", "max_steps=10", "device=cpu", "hydra.launcher.gpus_per_node=1",
                             "hydra.launcher.tasks_per_node=1"], launcher="slurm", sweep_dir=tmp_path / "s")
    assert time.monotonic() - start < 60 and all(r.job_id for r in sweep.runs)
    done = sweep.wait(poll_s=1, timeout_s=300)
    assert [r.state for r in done.runs] == [State.COMPLETED, State.COMPLETED], [(r.state, r.note) for r in done.runs]
    for run in done.runs:  # what sacct says, attempt by attempt
        for _ in range(20):
            acct = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", run.job_id, "-o", "ElapsedRaw,AllocTRES,State"],
                                  capture_output=True, text=True).stdout.split()
            if acct and acct[-1].endswith("|COMPLETED"):  # the end is in accounting: elapsed counts no more
                break
            time.sleep(0.5)
        elapsed = sum(int(line.split("|")[0]) for line in acct)
        cost = hpctrain.load(tmp_path / "s").runs[run.idx].cost
        assert cost is not None and not cost.estimated, cost
        assert cost.gpu_hours == pytest.approx(elapsed / 3600) and cost.attempts == len(acct)
    status = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(tmp_path / "s"), "--json"],
                            capture_output=True, text=True, env=hpctrain_env(), cwd=tmp_path)
    shown = json.loads(status.stdout)
    api = hpctrain.load(tmp_path / "s")
    assert [r["gpu_hours"] for r in shown["runs"]] == pytest.approx([r.cost.gpu_hours for r in api.runs])
    assert shown["gpu_hours"] == pytest.approx(api.gpu_hours()) and api.gpu_hours() > 0
