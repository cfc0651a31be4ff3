"""The review commands' decisions on small sweep dirs written by hand: states, ranking, discovery, formats.

The real sweeps (local and Slurm) are in test_review_local.py and test_review_slurm.py; here each case
of "what is really there" is set up exactly, including a stand-in squeue on PATH.
"""

import json
import math
import os
import time
from pathlib import Path

import pytest

from hpctrain.review import fmt, jobs, plots, queue
from hpctrain.review.discover import expected_runs
from hpctrain.review.ranking import default_mode, rank, reproduce_command
from hpctrain.review.runs import RunRecord, collect
from hpctrain.review.sweepdir import SweepError, find_sweep_dir, load_sweep, parse_overrides, swept_keys


def make_sweep(root: Path, runs: dict, launcher: str = "slurm") -> Path:
    """``runs``: {idx: {"metrics": {...} | None, "events": [...], "err": str, "job_id": str}}."""
    root.mkdir(parents=True, exist_ok=True)
    folder = root / ".submitit"
    folder.mkdir(exist_ok=True)
    manifest = {"launcher": launcher, "submitit_folder": str(folder), "submissions": [], "runs": {}}
    for idx, spec in runs.items():
        name = f"{idx}_lr={idx}"
        job_id = spec.get("job_id", f"100_{idx}")
        manifest["runs"][str(idx)] = {"name": name, "run_dir": name, "overrides": [f"lr={idx}", "max_steps=10"],
                                      "job_id": job_id, "max_steps": 10}
        if spec.get("metrics") is not None:
            (root / name).mkdir(exist_ok=True)
            (root / name / "metrics.json").write_text(json.dumps(spec["metrics"]))
        if spec.get("events"):
            events = root / ".hpctrain" / "events"
            events.mkdir(parents=True, exist_ok=True)
            (events / f"{idx}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in spec["events"]))
        if "err" in spec:
            (folder / f"{job_id}_0_log.err").write_text(spec["err"])
            (folder / f"{job_id}_0_log.out").write_text("submitit INFO - Starting\n")
        if "result" in spec:
            (folder / f"{job_id}_0_result.pkl").write_bytes(spec["result"])
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def states(sweep_dir: Path) -> dict:
    return {r.idx: r.state for r in collect(load_sweep(sweep_dir)).runs}


@pytest.fixture
def fake_squeue(tmp_path, monkeypatch):
    """A stand-in ``squeue`` on PATH printing the given lines (or failing with the given message)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def install(lines=(), fail: str = "") -> None:
        body = f"echo '{fail}' >&2; exit 1" if fail else "cat <<'EOF'\n" + "\n".join(lines) + "\nEOF"
        for tool, script in (("squeue", body), ("sacct", "echo 'Slurm accounting storage is disabled' >&2; exit 1")):
            path = bin_dir / tool
            path.write_text(f"#!/bin/sh\n{script}\n")
            path.chmod(0o755)

    return install


RUNNING = {"status": "running", "step": 4, "max_steps": 10, "started": time.time() - 30, "metrics": {"train/loss": 1.5}}


def start(idx: int, job: str = "100") -> dict:
    return {"event": "start", "time": 1.0, "job_id": f"{job}_{idx}"}


def test_states_from_queue_and_files(tmp_path, fake_squeue):
    fake_squeue(["100_0|RUNNING|None", "100_1|PENDING|Priority", "100_2|PENDING|BeginTime"])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "events": [start(0)]},
        1: {},  # queued, never started
        2: {"metrics": {**RUNNING, "status": "requeued"}, "events": [start(2), start(2)]},  # requeued, waiting again
        3: {"metrics": {"status": "completed", "step": 10, "max_steps": 10, "elapsed_s": 12.0,
                        "metrics": {"train/loss": 0.1}}},
        4: {"metrics": {**RUNNING, "status": "failed", "error": "Traceback\nValueError: bad"}},
        5: {"metrics": RUNNING, "err": "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-01-01T00:00:00 "
                                       "DUE TO TIME LIMIT ***\n"},
        6: {"metrics": RUNNING, "err": "slurmstepd: error: *** JOB 8 ON n1 CANCELLED AT 2024-01-01T00:00:00 ***\n"},
        7: {"metrics": RUNNING, "err": "submitit - Job not requeued because: timed-out too many times.\n"},
        8: {},  # left the queue without starting (scancel by hand, no accounting)
        9: {"metrics": RUNNING, "events": [start(9)], "err": ""},  # vanished mid-run, no result, no marker
        10: {"metrics": {**RUNNING, "status": "failed",  # the app saw submitit give up at the time limit
                         "error": "UncompletedJobError: Job not requeued because: timed-out too many times."}},
    })
    snap = collect(load_sweep(sweep))
    got = {r.idx: r.state for r in snap.runs}
    assert got == {0: "running", 1: "pending", 2: "requeued", 3: "completed", 4: "failed", 5: "timeout",
                   6: "cancelled", 7: "timeout", 8: "cancelled", 9: "failed", 10: "timeout"}
    by_idx = {r.idx: r for r in snap.runs}
    assert by_idx[1].note == "Priority" and by_idx[1].step is None
    assert by_idx[2].restarts == 1
    assert by_idx[3].elapsed_s == 12.0 and by_idx[3].loss == 0.1
    assert by_idx[0].elapsed_s >= 30 and by_idx[0].step == 4 and by_idx[0].max_steps == 10
    assert by_idx[4].error.endswith("ValueError: bad")
    assert by_idx[5].log.endswith("100_5_0_log.err")  # the log that says why
    assert "without a result" in by_idx[9].note
    assert snap.counts() == {"pending": 1, "running": 1, "requeued": 1, "completed": 1, "failed": 2, "timeout": 3,
                             "cancelled": 2}


def test_rerun_of_a_failed_run_is_judged_by_its_new_job(tmp_path, fake_squeue):
    """A failed run submitted again: its old metrics.json and events belong to the old job."""
    old = [start(0, "90"), {"event": "failed", "job_id": "90_0", "error": "x"}, {"event": "retry"},
           start(0, "90"), {"event": "failed", "job_id": "90_0", "error": "RuntimeError: old"},
           {"event": "submitted", "job_id": "100_0"}]
    failed = {**RUNNING, "status": "failed", "error": "RuntimeError: old"}
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": failed, "events": old}})
    fake_squeue(["100_0|PENDING|Priority"])
    snap = collect(load_sweep(sweep))
    assert snap.runs[0].state == "pending" and snap.runs[0].restarts == 0
    fake_squeue([])  # cancelled by hand before it started
    assert states(sweep) == {0: "cancelled"}
    fake_squeue(["100_0|RUNNING|None"])
    (sweep / ".hpctrain" / "events" / "0.jsonl").open("a").write(json.dumps(start(0)) + "\n")
    assert states(sweep) == {0: "running"}


def test_cancel_record_and_result_pickle_and_sacct(tmp_path, fake_squeue, monkeypatch):
    fake_squeue([])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING},
        1: {"result": b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x07success\x94}\x94."},
        2: {"result": b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05error\x94X\x05\x00\x00\x00boom."},
        3: {},
        4: {"metrics": {"status": "completed", "step": 10}},
    })
    jobs.record_cancelled(sweep, {"100_0": 0, "100_4": 4})
    monkeypatch.setattr(queue, "sacct_states", lambda ids: {"100_[3-5%2]": "TIMEOUT"})
    # a run that completed stays completed even if a cancel was recorded for its job
    assert states(sweep) == {0: "cancelled", 1: "completed", 2: "failed", 3: "timeout", 4: "completed"}


def test_unknown_queue_trusts_files_and_warns(tmp_path, fake_squeue):
    fake_squeue(fail="slurm_load_jobs error: Unable to contact slurm controller")
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "events": [start(0)]}, 1: {}})
    snap = collect(load_sweep(sweep))
    assert [r.state for r in snap.runs] == ["running", "pending"]
    assert snap.warnings and "squeue" in snap.warnings[0]


def test_invalid_job_id_is_an_empty_queue(fake_squeue):
    fake_squeue(fail="slurm_load_jobs error: Invalid job id specified")
    assert queue.squeue_query(["5_1"]) == {}


def test_squeue_query_expands_array_ranges(fake_squeue):
    fake_squeue(["14_0|RUNNING|None", "14_[1-3,7%2]|PENDING|JobArrayTaskLimit", "15|PENDING|Priority"])
    got = queue.squeue_query(["14_0", "15"])
    assert got["14_0"] == ("RUNNING", "None") and got["15"] == ("PENDING", "Priority")
    assert {k for k, v in got.items() if v[1] == "JobArrayTaskLimit"} == {"14_1", "14_2", "14_3", "14_7"}


def test_local_states(tmp_path, monkeypatch):
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "job_id": "4242"}, 1: {"metrics": RUNNING,
                                                                                       "job_id": "4343"}},
                       launcher="local")
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": pid == "4242")
    assert states(sweep) == {0: "running", 1: "failed"}  # 4343's controller is gone without a result


def test_local_sweep_in_flight_without_manifest(tmp_path, monkeypatch):
    """No sweep.json yet: runs from multirun.yaml (Hydra's own expansion) matched to the run dirs there."""
    sweep = tmp_path / "s"
    (sweep / "2_lr=2,seed=0" / ".hydra").mkdir(parents=True)
    (sweep / "2_lr=2,seed=0" / ".hydra" / "overrides.yaml").write_text("- lr=2\n- seed=0\n")
    (sweep / "2_lr=2,seed=0" / "metrics.json").write_text(json.dumps(RUNNING))
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  launcher:\n    _target_: hydra_plugins.hpctrain_launcher.local.LocalLauncher\n"
        "    submitit_folder: ${hydra.sweep.dir}/.submitit\n"
        "  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n    params: null\n"
        "  overrides:\n    task:\n    - lr=1,2\n    - seed=0,1\nmax_steps: 10\n")
    (sweep / ".hpctrain" / "events").mkdir(parents=True)
    (sweep / ".hpctrain" / "events" / "2.jsonl").write_text(json.dumps({"event": "start", "job_id": "777"}) + "\n")
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": pid == "777")
    loaded = load_sweep(sweep)
    assert not loaded.has_manifest and loaded.launcher == "local" and loaded.swept == ["lr", "seed"]
    assert [r.overrides for r in loaded.runs] == [["lr=1", "seed=0"], ["lr=1", "seed=1"], ["lr=2", "seed=0"],
                                                  ["lr=2", "seed=1"]]  # Hydra's order: the last key varies fastest
    assert loaded.runs[2].job_id == "777" and loaded.runs[2].max_steps == 10
    assert loaded.runs[2].run_dir == sweep / "2_lr=2,seed=0" and loaded.runs[0].run_dir is None
    assert states(sweep) == {0: "pending", 1: "pending", 2: "running", 3: "pending"}
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": False)  # the run's controller is gone
    assert states(sweep) == {0: "pending", 1: "pending", 2: "failed", 3: "pending"}  # the sweep wrote lately
    for path in sweep.rglob("*"):  # ... and after a quiet minute, its launcher is taken as gone
        os.utime(path, (time.time() - 120, time.time() - 120))
    assert states(sweep) == {0: "cancelled", 1: "cancelled", 2: "failed", 3: "cancelled"}
    jobs.record_cancelled(sweep, {"run:1": 1})  # what `cancel` records for a local run that never started
    assert collect(load_sweep(sweep)).runs[1].note == "cancelled with hpctrain cancel"


def test_expected_runs_with_sweep_params_from_a_file():
    hydra = {"sweeper": {"params": {"seed": "0,1"}}, "overrides": {"task": ["lr=0.1,0.2", "max_steps=5"]}}
    assert expected_runs(hydra) == [["seed=0", "lr=0.1", "max_steps=5"], ["seed=0", "lr=0.2", "max_steps=5"],
                                    ["seed=1", "lr=0.1", "max_steps=5"], ["seed=1", "lr=0.2", "max_steps=5"]]


def test_find_sweep_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SweepError, match="no sweep found"):
        find_sweep_dir(None)
    old = make_sweep(tmp_path / "multirun" / "2024-01-01" / "10-00-00", {0: {}})
    new = make_sweep(tmp_path / "multirun" / "2024-01-02" / "09-00-00", {0: {}})
    os.utime(old / "sweep.json", (time.time(), time.time()))
    os.utime(new / "sweep.json", (time.time() - 100, time.time() - 100))
    assert find_sweep_dir(None) == old.absolute()  # newest by mtime, not by name
    with pytest.raises(SweepError, match="no such directory"):
        find_sweep_dir(str(tmp_path / "nope"))
    with pytest.raises(SweepError, match="not a sweep dir"):
        find_sweep_dir(str(tmp_path))
    (old / "0_lr=0").mkdir()
    with pytest.raises(SweepError, match="pass the sweep dir"):
        find_sweep_dir(str(old / "0_lr=0"))


def test_swept_keys_and_overrides():
    from hpctrain.review.sweepdir import RunSpec

    runs = [RunSpec(i, "", None, [f"lr={lr}", "max_steps=5", f"+model.width={w}"], None)
            for i, (lr, w) in enumerate([(0.1, 8), (0.01, 8), (0.1, 16)])]
    assert swept_keys(runs) == ["lr", "model.width"]
    assert swept_keys(runs[:1]) == ["lr", "max_steps", "model.width"]
    assert parse_overrides(["~seed", "++a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}


def _rec(idx, state, metrics, overrides=None):
    return RunRecord(idx=idx, name=str(idx), values={"lr": str(idx)}, overrides=overrides or [f"lr={idx}"],
                     run_dir=None, job_id=None, state=state, metrics=metrics)


def test_ranking_prefers_completed_runs_and_skips_nan():
    records = [_rec(0, "completed", {"val/loss": 0.5}), _rec(1, "running", {"val/loss": 0.1}),
               _rec(2, "completed", {"val/loss": 0.3}), _rec(3, "completed", {"val/loss": math.nan}),
               _rec(4, "failed", {})]
    r = rank(records, "val/loss", "min", {})
    assert [x.record.idx for x in r.runs] == [1, 2, 0, 3, 4]
    assert r.best.record.idx == 2 and [x.rank for x in r.runs] == [1, 2, 3, None, None]
    assert rank(records, "val/loss", "max", {}).best.record.idx == 0
    only_running = rank([records[1]], "val/loss", "min", {})
    assert only_running.best.record.idx == 1 and "no run has completed" in only_running.best_note
    assert rank(records, "val/acc", "max", {4: {"val/acc": 0.9}}).best.record.idx == 4  # from TensorBoard's last value
    assert default_mode("val/loss") == "min" and default_mode("val/acc") == "max"


def test_reproduce_command_quotes_overrides():
    rec = _rec(0, "completed", {}, overrides=["lr=0.1", "data.path='/a b'", "+tag=x;y"])
    assert reproduce_command(rec, "hpctrain.app") == "python -m hpctrain lr=0.1 'data.path='\"'\"'/a b'\"'\"'' '+tag=x;y'"


def test_formats():
    assert [fmt.duration(s) for s in (None, 3.25, 42, 125, 7300, 200000)] == ["-", "3.2s", "42s", "2m05s", "2h01m",
                                                                              "2d07h"]
    assert fmt.bar(5, 10, width=4) == "5/10 ██░░  50%"
    assert fmt.bar(None, 10) == "-" and fmt.bar(3, None) == "3/?"
    assert fmt.number(0.000123456) == "0.0001235" and fmt.number(None) == "-"
    assert plots.spans_decades([1e-4, 1e-3]) and not plots.spans_decades([1, 5]) and not plots.spans_decades([0, 100])
    assert plots.file_name("model/opt.lr") == "metric_vs_model_opt.lr.png"
    assert queue.expand_array_ids("9") == ["9"] and queue.expand_array_ids("9_[0-1]") == ["9_0", "9_1"]
