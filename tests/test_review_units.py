"""The review commands' decisions on small sweep dirs written by hand: states, ranking, discovery, formats.

The real sweeps (local and Slurm) are in test_review_local.py and test_review_slurm.py; here each case
of "what is really there" is set up exactly: run records written with hpctrain.core.events's own
transitions, and a stand-in squeue/sacct on PATH.
"""

import dataclasses
import json
import math
import os
import time
from pathlib import Path

import pytest

from hpctrain.slurm import query as slurm
from hpctrain.core import events
from hpctrain.review import fmt, jobs, plots
from hpctrain.review.ranking import default_metric, default_mode, rank, reproduce_command
from hpctrain.review.runs import Run, collect
from hpctrain.review.sweep import ListedRun, SweepError, expected_runs, find_sweep_dir, load_sweep, parse_overrides, swept_keys

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra


def make_sweep(root: Path, runs: dict, launcher: str = "slurm") -> Path:
    """``runs``: {idx: {"metrics": {...} | None, "record": [(transition, kwargs)], "err": str, "out": str,
    "job_id": str}}."""
    root.mkdir(parents=True, exist_ok=True)
    folder = root / ".submitit"
    folder.mkdir(exist_ok=True)
    manifest = {"launcher": launcher, "submitit_folder": str(folder), "submissions": [], "runs": {}}
    for idx, spec in runs.items():
        name = f"{idx}_lr={idx}"
        job_id = spec.get("job_id", f"100_{idx}")
        manifest["runs"][str(idx)] = {"name": name, "run_dir": name, "overrides": [f"lr={idx}", "max_steps=10"],
                                      "job_id": job_id, "max_steps": 10}
        (root / name).mkdir(exist_ok=True)
        for transition, kwargs in spec.get("record", [("submitted", {})]):
            getattr(events, transition)(root / name, **kwargs)
        if spec.get("metrics") is not None:
            (root / name / "metrics.json").write_text(json.dumps(spec["metrics"]))
        if "err" in spec:
            (folder / f"{job_id}_0_log.err").write_text(spec["err"])
            (folder / f"{job_id}_0_log.out").write_text(spec.get("out", "submitit INFO - Starting\n"))
        if "result" in spec:
            (folder / f"{job_id}_0_result.pkl").write_bytes(spec["result"])
    (root / "sweep.json").write_text(json.dumps(manifest))
    return root


def states(sweep_dir: Path) -> dict:
    return {r.idx: r.state for r in collect(load_sweep(sweep_dir)).runs}


@pytest.fixture
def fake_squeue(tmp_path, monkeypatch):
    """A stand-in ``squeue`` on PATH printing the given lines (or failing with the given message); ``sacct``
    prints ``acct`` lines or fails as without accounting."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def install(lines=(), fail: str = "", acct=()) -> None:
        body = f"echo '{fail}' >&2; exit 1" if fail else "cat <<'EOF'\n" + "\n".join(lines) + "\nEOF"
        sacct = ("cat <<'EOF'\n" + "\n".join(acct) + "\nEOF" if acct
                 else "echo 'Slurm accounting storage is disabled' >&2; exit 1")
        for tool, script in (("squeue", body), ("sacct", sacct)):
            path = bin_dir / tool
            path.write_text(f"#!/bin/sh\n{script}\n")
            path.chmod(0o755)

    return install


RUNNING = {"step": 4, "max_steps": 10, "started": time.time() - 30, "metrics": {"train/loss": 1.5}}
SUBMITTED = ("submitted", {})


def started(job: str = "100_0") -> tuple:
    return ("started", {"job_id": job})


def test_states_from_record_and_queue(tmp_path, fake_squeue):
    fake_squeue(["100_0|RUNNING|None", "100_1|PENDING|Priority", "100_2|PENDING|BeginTime",
                 "100_11|PENDING|BeginTime"])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0")]},
        1: {},  # queued, never started
        2: {"metrics": RUNNING, "record": [SUBMITTED, started("100_2"), ("requeued", {})]},  # waiting again
        3: {"metrics": {"step": 10, "max_steps": 10, "elapsed_s": 12.0, "metrics": {"train/loss": 0.1}},
            "record": [SUBMITTED, started("100_3"), ("completed", {})]},
        4: {"metrics": RUNNING, "record": [SUBMITTED, started("100_4"), ("failed", {"error": "Traceback\nValueError: bad"})]},
        5: {"metrics": RUNNING, "record": [SUBMITTED, started("100_5")],
            "err": "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***\n"},
        6: {"metrics": RUNNING, "record": [SUBMITTED, started("100_6")],
            "err": "slurmstepd: error: *** JOB 8 ON n1 CANCELLED AT 2024-01-01T00:00:00 ***\n"},
        7: {"metrics": RUNNING, "record": [SUBMITTED, started("100_7"), ("timed_out", {"error": "timed-out too many times"})]},
        8: {},  # left the queue without starting (scancel by hand, no accounting)
        9: {"metrics": RUNNING, "record": [SUBMITTED, started("100_9")], "err": ""},  # vanished mid-run, no word
        10: {"record": [SUBMITTED, started("100_10"), ("pruned", {"step": 3})]},
        11: {"record": [SUBMITTED, started("100_11"), ("failed", {"error": "x", "rank": 1}), ("retrying", {"attempt": 1, "of": 1})]},
        12: {"metrics": RUNNING, "record": [SUBMITTED, started("100_12")],  # as the test cluster wrote it
             "err": "slurmstepd: error: *** JOB 9 ON n2 CANCELLED AT 2026-12-01T09:15:00 DUE TO NODE FAILURE, "
                    "SEE SLURMCTLD LOG FOR DETAILS ***\n"},
    })
    snap = collect(load_sweep(sweep))
    got = {r.idx: r.state for r in snap.runs}
    assert got == {0: "running", 1: "queued", 2: "requeued", 3: "completed", 4: "failed", 5: "timeout",
                   6: "cancelled", 7: "timeout", 8: "cancelled", 9: "failed", 10: "pruned", 11: "retrying",
                   12: "failed"}
    by_idx = {r.idx: r for r in snap.runs}
    assert by_idx[1].note == "Priority" and by_idx[1].step is None
    assert by_idx[3].elapsed_s == 12.0 and by_idx[3].loss == 0.1
    assert by_idx[0].elapsed_s >= 30 and by_idx[0].step == 4 and by_idx[0].max_steps == 10
    assert by_idx[4].error.endswith("ValueError: bad")
    assert by_idx[5].log.endswith("100_5_0_log.err")  # the log that says why
    assert "without a result" in by_idx[9].note
    assert snap.counts() == {"queued": 1, "running": 1, "requeued": 1, "retrying": 1, "completed": 1, "failed": 3,
                             "timeout": 2, "cancelled": 2, "pruned": 1}


def test_restarts_and_a_rerun_of_a_failed_run(tmp_path, fake_squeue):
    """A failed run submitted again: its old attempts belong to the old submission."""
    old = [SUBMITTED, started("90_0"), ("failed", {"error": "x"}), ("retrying", {"attempt": 1, "of": 1}),
           started("90_0"), ("failed", {"error": "RuntimeError: old"})]
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "record": old}})
    fake_squeue([])
    snap = collect(load_sweep(sweep))
    assert snap.runs[0].state == "failed" and snap.runs[0].restarts == 1 and snap.runs[0].error == "RuntimeError: old"
    events.submitted(sweep / "0_lr=0")
    fake_squeue(["100_0|PENDING|Priority"])
    snap = collect(load_sweep(sweep))
    assert snap.runs[0].state == "queued" and snap.runs[0].restarts == 0
    fake_squeue([])  # cancelled by hand before it started
    assert states(sweep) == {0: "cancelled"}
    fake_squeue(["100_0|RUNNING|None"])
    events.started(sweep / "0_lr=0", job_id="100_0")
    assert states(sweep) == {0: "running"}


def test_sacct_completed_without_a_recorded_completion_is_failed(tmp_path, fake_squeue):
    """A job script can exit 0 with its run unfinished (an app that returns early, a job script of an
    older submission): sacct's COMPLETED alone must not make a run completed."""
    fake_squeue([], acct=["100_0|COMPLETED", "100_1|COMPLETED"])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0")]},
        1: {"record": [SUBMITTED, started("100_1"), ("completed", {})]},
    })
    snap = collect(load_sweep(sweep))
    assert [r.state for r in snap.runs] == ["failed", "completed"]
    assert "never recorded its completion" in snap.runs[0].note


def _start(at: str) -> str:
    return f"submitit INFO ({at},714) - Starting with JobEnvironment(job_id=1892, hostname=n1, local_rank=0(1))\n"


def test_an_earlier_attempts_preemption_lines_do_not_say_how_the_job_ended(tmp_path, fake_squeue):
    """The job's logs are appended over its attempts: a grace-time preemption's step cancel and Slurm's own
    requeue lines (as the test cluster wrote them) are not how a later attempt that vanished ended."""
    fake_squeue([])
    grace = ("slurmstepd-n1: error: *** STEP 1892.0 ON n1 CANCELLED AT 2026-12-02T02:56:00 ***\n"
             "slurmstepd-n1: error: *** JOB 1892 ON n1 CANCELLED AT 2026-12-02T02:56:00 DUE TO JOB REQUEUE ***\n")
    no_grace = ("slurmstepd-n1: error: *** JOB 1896 ON n1 CANCELLED AT 2026-12-02T02:56:51 DUE TO PREEMPTION ***\n"
                "slurmstepd-n1: error: *** STEP 1896.0 ON n1 CANCELLED AT 2026-12-02T02:56:51 DUE TO PREEMPTION ***\n")
    sweep = make_sweep(tmp_path / "s", {
        # preempted with a grace time, ran again, then vanished without a word
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0"), ("requeued", {}), started("100_0")],
            "err": grace, "out": _start("2026-12-02 02:55:40") + _start("2026-12-02 02:56:10")},
        # preempted without one: still in that attempt's log only
        1: {"metrics": RUNNING, "record": [SUBMITTED, started("100_1")],
            "err": no_grace, "out": _start("2026-12-02 02:56:40")},
        # preempted, ran again, then cancelled by hand: that one counts
        2: {"metrics": RUNNING, "record": [SUBMITTED, started("100_2"), ("requeued", {}), started("100_2")],
            "err": grace + "slurmstepd-n1: error: *** JOB 1892 ON n1 CANCELLED AT 2026-12-02T02:58:00 ***\n",
            "out": _start("2026-12-02 02:55:40") + _start("2026-12-02 02:56:10")},
    })
    assert states(sweep) == {0: "failed", 1: "failed", 2: "cancelled"}


def test_cancelled_record_result_pickle_and_sacct(tmp_path, fake_squeue):
    fake_squeue([], acct=["100_[3-5%2]|TIMEOUT", "100_6|CANCELLED by 0"])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0"), ("cancelled", {})]},
        1: {"record": [SUBMITTED, started("100_1")],
            "result": b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x07success\x94}\x94."},
        2: {"record": [SUBMITTED, started("100_2")],
            "result": b"\x80\x05\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05error\x94X\x05\x00\x00\x00boom."},
        3: {"record": [SUBMITTED, started("100_3")]},
        4: {"record": [SUBMITTED, started("100_4"), ("completed", {}), ("cancelled", {})]},
        6: {},
    })
    # a run that completed stays completed even if a cancel was recorded for it
    assert states(sweep) == {0: "cancelled", 1: "completed", 2: "failed", 3: "timeout", 4: "completed", 6: "cancelled"}


@pytest.mark.parametrize("message", ["slurm_load_jobs error: Socket timed out on send/recv operation",
                                     "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"])
def test_a_failed_squeue_is_unknown_never_gone(tmp_path, fake_squeue, message):
    fake_squeue(fail=message)
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0")]}, 1: {}})
    assert slurm.squeue(["100_0"]) is None
    snap = collect(load_sweep(sweep))
    assert [r.state for r in snap.runs] == ["running", "queued"]
    assert snap.warnings and "squeue" in snap.warnings[0]


def test_invalid_job_id_is_an_empty_queue(fake_squeue):
    fake_squeue(fail="slurm_load_jobs error: Invalid job id specified")
    assert slurm.squeue(["5_1"]) == {}


def test_squeue_expands_array_ranges(fake_squeue):
    fake_squeue(["14_0|RUNNING|None", "14_[1-3,7%2]|PENDING|JobArrayTaskLimit", "15|PENDING|Priority"])
    got = slurm.squeue(["14_0", "15"])
    assert got["14_0"] == ("RUNNING", "None") and got["15"] == ("PENDING", "Priority")
    assert {k for k, v in got.items() if v[1] == "JobArrayTaskLimit"} == {"14_1", "14_2", "14_3", "14_7"}


def test_local_states(tmp_path, monkeypatch):
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "job_id": "4242", "record": [SUBMITTED, started("4242")]},
                                        1: {"metrics": RUNNING, "job_id": "4343", "record": [SUBMITTED, started("4343")]}},
                       launcher="local")
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": pid == "4242")
    assert states(sweep) == {0: "running", 1: "failed"}  # 4343's controller is gone without a result


def test_local_sweep_in_flight_without_manifest(tmp_path, monkeypatch):
    """No sweep.json yet: runs from multirun.yaml (Hydra's own expansion) matched to the run dirs there."""
    sweep = tmp_path / "s"
    run = sweep / "2_lr=2,seed=0"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- lr=2\n- seed=0\n")
    (run / "metrics.json").write_text(json.dumps(RUNNING))
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  launcher:\n    _target_: hpctrain.submit.backends.local.LocalLauncher\n"
        "    submitit_folder: ${hydra.sweep.dir}/.submitit\n"
        "  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n    params: null\n"
        "  overrides:\n    task:\n    - lr=1,2\n    - seed=0,1\nmax_steps: 10\n")
    events.submitted(run)
    events.started(run, job_id="777")
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": pid == "777")
    loaded = load_sweep(sweep)
    assert not loaded.has_manifest and loaded.launcher == "local" and loaded.swept == ["lr", "seed"]
    assert [r.overrides for r in loaded.runs] == [["lr=1", "seed=0"], ["lr=1", "seed=1"], ["lr=2", "seed=0"],
                                                  ["lr=2", "seed=1"]]  # Hydra's order: the last key varies fastest
    assert loaded.runs[2].job_id == "777" and loaded.runs[2].max_steps == 10
    assert loaded.runs[2].run_dir == run and loaded.runs[0].run_dir is None
    assert states(sweep) == {0: "queued", 1: "queued", 2: "running", 3: "queued"}
    monkeypatch.setattr(jobs, "pid_alive", lambda pid, needle="submitit": False)  # the run's controller is gone
    assert states(sweep) == {0: "queued", 1: "queued", 2: "failed", 3: "queued"}  # the sweep wrote lately
    for path in sweep.rglob("*"):  # ... and after a quiet minute, its launcher is taken as gone
        os.utime(path, (time.time() - 120, time.time() - 120))
    assert states(sweep) == {0: "cancelled", 1: "cancelled", 2: "failed", 3: "cancelled"}


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
    (old / "0_lr=0").mkdir(exist_ok=True)
    with pytest.raises(SweepError, match="pass the sweep dir"):
        find_sweep_dir(str(old / "0_lr=0"))


def test_swept_keys_and_overrides():
    runs = [ListedRun(i, "", None, [f"lr={lr}", "max_steps=5", f"+model.width={w}"], None)
            for i, (lr, w) in enumerate([(0.1, 8), (0.01, 8), (0.1, 16)])]
    assert swept_keys(runs) == ["lr", "model.width"]
    assert swept_keys(runs[:1]) == ["lr", "max_steps", "model.width"]
    assert parse_overrides(["~seed", "++a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}


def _rec(idx, state, metrics, overrides=None, objective=None):
    return Run(idx=idx, name=str(idx), values={"lr": str(idx)}, overrides=overrides or [f"lr={idx}"],
                     run_dir=None, job_id=None, state=state, metrics=metrics, declared_objective=objective)


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
    assert fmt.label({"lr": "0.1", "seed": "1"}) == "lr=0.1 seed=1"
    assert fmt.label({}, ["lr=0.1"]) == "lr=0.1" and fmt.label({}) == "(defaults)"
    # values shown to 4 significant digits; integers, short numbers as typed and text unchanged
    assert fmt.label({"lr": "0.0028002728307563543", "width": "12345", "wd": "1e-3", "act": "relu"}) == \
        "lr=0.0028 width=12345 wd=1e-3 act=relu"
    assert [fmt.value(v) for v in ("1.23456e-05", "0.30000000000000004", "1.5", "nan")] == ["1.235e-05", "0.3", "1.5", "nan"]


def test_the_declared_objective_ranks_by_default():
    objective = {"metric": "val/accuracy", "mode": "max"}
    records = [_rec(0, "completed", {"val/loss": 0.5, "val/accuracy": 0.7}, objective=objective),
               _rec(1, "completed", {"val/loss": 0.4, "val/accuracy": 0.6}, objective=objective),
               _rec(2, "pruned", {"val/loss": 0.9, "val/accuracy": 0.2}, objective=objective)]
    assert default_metric(records, {}) == "val/accuracy" and default_mode("val/accuracy", records) == "max"
    assert rank(records, "val/accuracy", "max", {}).best.record.idx == 0
    assert default_metric([_rec(0, "completed", {"val/loss": 1.0})], {}) == "val/loss"
    assert default_mode("value", [_rec(0, "completed", {}, objective={"metric": "value", "mode": "max"})]) == "max"



def test_status_watch_keeps_the_last_queue_answer_through_failed_calls(tmp_path, fake_squeue):
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0")]}, 1: {}})
    loaded = load_sweep(sweep)
    poller = slurm.Poller(lambda: slurm.squeue([r.job_id for r in loaded.runs]), "squeue")
    fake_squeue(["100_0|RUNNING|None", "100_1|PENDING|Priority"])
    assert [r.state for r in collect(loaded, poller).runs] == ["running", "queued"]
    fake_squeue(fail="slurm_load_jobs error: Socket timed out on send/recv operation")
    snap = collect(loaded, poller)
    assert [r.state for r in snap.runs] == ["running", "queued"] and snap.runs[1].note == "Priority"
    assert "squeue failed 1 time(s) in a row" in snap.warnings[0]


def test_held_and_slurm_requeued_runs_show_slurm_reason(tmp_path, fake_squeue):
    """A NODE_FAIL requeue that Slurm holds is held (with its reason), not queued; a job Slurm put back in
    the queue on its own (node failure, ``scontrol requeue``: no word in the record) is requeued; the new
    start such a requeue leads to counts as a restart."""
    fake_squeue(["100_0|REQUEUE_HOLD|launch failed requeued held", "100_1|PENDING|BeginTime",
                 "100_2|PENDING|JobHeldAdmin", "100_3|RUNNING|None"])
    sweep = make_sweep(tmp_path / "s", {
        0: {"metrics": RUNNING, "record": [SUBMITTED, started("100_0")]},
        1: {"metrics": RUNNING, "record": [SUBMITTED, started("100_1")]},
        2: {},
        3: {"metrics": RUNNING, "record": [SUBMITTED, started("100_3"), started("100_3")]},  # scontrol requeue
    })
    snap = collect(load_sweep(sweep))
    by_idx = {r.idx: r for r in snap.runs}
    assert {i: r.state for i, r in by_idx.items()} == {0: "held", 1: "requeued", 2: "held", 3: "running"}
    assert "launch failed requeued held" in by_idx[0].note and "JobHeldAdmin" in by_idx[2].note
    assert "requeued by Slurm" in by_idx[1].note
    assert by_idx[3].restarts == 1
    assert snap.counts() == {"running": 1, "requeued": 1, "held": 2}


def _retime(run_dir: Path, seconds: list) -> None:
    """Set the record's event times (the file names' first part) to ``seconds`` after a fixed moment."""
    record = run_dir / ".hpctrain" / "record"
    names = sorted(os.listdir(record))
    assert len(names) == len(seconds)
    for name, s in zip(names, seconds):
        os.rename(record / name, record / (f"{int(1.7e18 + s * 1e9):020d}" + name[20:]))


def test_elapsed_counts_every_attempt_not_only_the_last(tmp_path, fake_squeue):
    """A run resumed at its last step (a rerun of edited code, a retry after the final save) trains 0.3 s in
    its last attempt, which metrics.json's elapsed_s is; the earlier attempt's 100 s by the record count too."""
    fake_squeue([])
    sweep = make_sweep(tmp_path / "s", {0: {
        "metrics": {"step": 10, "max_steps": 10, "elapsed_s": 0.3, "metrics": {"train/loss": 0.1}},
        "record": [SUBMITTED, started("100_0"), ("requeued", {}), started("100_0"), ("completed", {})]}})
    _retime(sweep / "0_lr=0", [0, 1, 101, 200, 201])
    (run,) = collect(load_sweep(sweep)).runs
    assert run.state == "completed" and run.attempts == 2
    assert run.elapsed_s == pytest.approx(100.3) and run.wall_s == pytest.approx(101)


def test_a_requeue_records_its_steps_and_the_cost_says_what_was_redone(tmp_path, fake_squeue):
    """The requeue's event holds the step the run stopped at (metrics.json's) and its checkpoint's step (as
    the checkpointer noted it); the steps between are trained again and take their share of the GPU-hours."""
    from hpctrain.review import cost

    fake_squeue([])
    sweep = make_sweep(tmp_path / "s", {0: {"metrics": {"step": 200, "max_steps": 200},
                                            "record": [SUBMITTED, started("100_0")]}})
    run_dir = sweep / "0_lr=0"
    (run_dir / "metrics.json").write_text(json.dumps({"step": 150, "max_steps": 200}))
    events.checkpoint_at(run_dir, 100)  # a checkpoint at 100, none since: 50 steps lost to the signal
    events.requeued(run_dir)
    assert [e.data() for e in events.events(run_dir) if e.kind == "requeued"][0]["checkpoint_step"] == 100
    events.started(run_dir, job_id="100_0")
    events.checkpoint_at(run_dir, 160)  # resumed, then checkpointed at the signal: nothing lost
    (run_dir / "metrics.json").write_text(json.dumps({"step": 160, "max_steps": 200}))
    events.requeued(run_dir)
    events.started(run_dir, job_id="100_0")
    events.requeued(run_dir, step=None)  # an app that does not say its step: not counted, said so
    events.started(run_dir, job_id="100_0")
    events.completed(run_dir)
    (run_dir / "metrics.json").write_text(json.dumps({"step": 200, "max_steps": 200}))
    (run,) = collect(load_sweep(sweep)).runs
    assert run.requeue_steps == [(150, 100), (160, 160), (None, 160)]
    run = dataclasses.replace(run, cost=cost.with_redone(cost.Cost(2.5, 10.0, 9000, 4, False), run.requeue_steps, run.step))  # a run is frozen
    assert run.cost.requeues == 3 and run.cost.redone_steps == 50 and run.cost.redone_unknown == 1
    assert run.cost.redone_gpu_hours == pytest.approx(2.5 * 50 / 250)
    assert cost.redone_line([run]) == ("redone after 3 requeues: 0.5 GPU-hours (50 steps between the last "
                                       "checkpoint and the signal); 1 requeue(s) without the steps in their "
                                       "record: not counted")
