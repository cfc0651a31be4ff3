"""The read side's work per run, counted in function calls (independent of the machine's load): status and
``hpctrain.load`` read 10,000 runs on the login node (issue 31: each under 1 s)."""

import sys
from pathlib import Path

from call_count import calls as _calls
from hpctrain.core import events


def _record(run: Path, end: str) -> Path:
    events.submitted(run)
    events.started(run, job_id="1_0")
    events.completed(run) if end == "completed" else events.failed(run, "RuntimeError: boom", rank=0)
    return run


def test_reading_a_record_parses_its_names_and_folds_in_few_calls(tmp_path):
    done, failed = _record(tmp_path / "done", "completed"), _record(tmp_path / "failed", "failed")
    assert events.read(done).state.value == "completed" and events.read(failed).error == "RuntimeError: boom"
    # measured: 104 and 278 calls (the failed one opens its error's file); before, 154 and 331
    assert _calls(lambda: events.read(done)) <= 115
    assert _calls(lambda: events.read(failed)) <= 295


def test_a_run_row_given_its_state_does_not_parse_it_again():
    from hpctrain.core.state import State
    from hpctrain.review.runs import Run

    def make():
        return Run(idx=0, name="a", values={}, overrides=[], run_dir=None, job_id=None, state=State.COMPLETED)

    assert make().state is State.COMPLETED and Run(**{**make().to_dict(), "state": "failed"}).state is State.FAILED
    assert _calls(make) <= 4  # the dataclass's init and its check; an Enum call more (~25 us a row) before


def test_a_new_sweeps_rerun_check_reads_nothing_per_run(tmp_path):
    """The launcher sorts every point into run/skip before submitting: a run dir that does not exist yet has no
    record and no summary to read (1,000 points: three record reads a run before)."""
    from hpctrain.core.run import RunSpec
    from hpctrain.submit import rerun
    from hpctrain.submit.plan import PlannedRun

    runs = [PlannedRun(RunSpec(i, (f"lr={i}",), tmp_path / f"{i}_lr={i}", 10)) for i in range(100)]
    done = runs[0].run_dir
    _record(done, "completed")
    out = rerun.sort(runs, "app", tmp_path, lambda ids: set())
    assert [r.run_dir for r in out.completed] == [done] and len(out.todo) == 99
    per_run = (_calls(lambda: rerun.sort(runs, "app", tmp_path, lambda ids: set())) - _calls(
        lambda: rerun.sort(runs[:1], "app", tmp_path, lambda ids: set()))) / 99
    assert per_run <= 15, per_run  # measured: 11 calls a run; 207 before


def test_the_read_side_imports_no_process_library():
    """``hpctrain.load`` and ``status`` of a Slurm sweep never ask about a local pid: psutil (6 modules, ~30 ms)
    is imported where a pid is asked about, not at import."""
    import subprocess

    code = ("import sys, hpctrain; hpctrain.load; import hpctrain.review.status, hpctrain.review.cli; "
            "print('psutil' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _old_walls(rs, now, running, last_seen=None):
    """attempt_walls before the one-pass version: the reference it must agree with."""
    from hpctrain.core.state import EventKind

    ordered = sorted(rs.events, key=lambda e: e.time_ns)
    walls = []
    for i, start in enumerate(ordered):
        if start.kind is not EventKind.STARTED or start.rank > 0:
            continue
        ended = next((e.time_ns for e in ordered[i + 1:] if e.kind is not EventKind.STARTED), None)
        if ended is None:
            seen = last_seen * 1e9 if isinstance(last_seen, (int, float)) and not isinstance(last_seen, bool) else 0.0
            end_ns = now * 1e9 if running else max(start.time_ns, min(seen, now * 1e9))
        else:
            end_ns = ended
        walls.append(max(0.0, (end_ns - start.time_ns) / 1e9))
    return walls


def test_attempt_walls_takes_one_pass_and_agrees_with_the_scan_it_replaced():
    import random

    from hpctrain.core.state import Event, EventKind, RunState
    from hpctrain.review import cost

    rng = random.Random(31)
    kinds = [EventKind.SUBMITTED, EventKind.STARTED, EventKind.STARTED, EventKind.FAILED, EventKind.REQUEUED,
             EventKind.COMPLETED]
    for _ in range(300):
        events_ = [Event(rng.randrange(10) * 10**9, rng.choice(kinds), rng.choice([-1, 0, 0, 1]), f"p{i}")
                   for i in range(rng.randrange(8))]
        rs = RunState(state=None, events=events_)
        for running, seen in ((True, None), (False, 4.5), (False, True), (False, None)):
            assert cost.attempt_walls(rs, 20.0, running, seen) == _old_walls(rs, 20.0, running, seen)
    # a record of a run that requeued twice and completed: 12 events, the size of a busy run's
    rs = RunState(state=None, events=[Event(t * 10**9, k, 0, f"e{t}") for t, k in enumerate(
        [EventKind.SUBMITTED] + [EventKind.STARTED, EventKind.STARTED, EventKind.REQUEUED] * 3 + [EventKind.STARTED,
                                                                                                 EventKind.COMPLETED])])
    # measured: 20 calls; the scan it replaced 51 (a key lambda an event, a generator a start)
    assert _calls(lambda: cost.attempt_walls(rs, 20.0, False)) <= 24


def test_the_queue_and_the_cost_are_asked_at_once(tmp_path, monkeypatch):
    """``sacct``'s cost call runs beside ``squeue`` (one slurmdbd wait less on the login node): the stand-in
    squeue waits up to 5 s for sacct to have started and says whether it did."""
    import json
    import os

    from hpctrain.review.runs import collect
    from hpctrain.review.sweep import load_sweep

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nfor i in $(seq 100); do [ -e {tmp_path}/sacct.started ] && "
                                    f"echo yes > {tmp_path}/overlap && break; sleep 0.05; done\n")
    (bin_dir / "sacct").write_text(f"#!/bin/sh\ntouch {tmp_path}/sacct.started\nsleep 0.5\n")
    for tool in ("squeue", "sacct"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sweep = tmp_path / "s"
    _record(sweep / "0_a", "completed")
    (sweep / "sweep.json").write_text(json.dumps({"launcher": "slurm", "submitit_folder": str(sweep / ".submitit"),
                                                  "runs": {"0": {"run_dir": "0_a", "overrides": ["a=1"],
                                                                 "job_id": "5_0"}}}))
    assert collect(load_sweep(sweep)).runs[0].state.value == "completed"
    assert (tmp_path / "overlap").exists()


def test_reading_a_sweep_runs_no_cyclic_garbage_collection(tmp_path):
    """Each full collection walks every live object: 10,000 runs' rows are about a million (0.1-0.2 s a
    read measured). The collector is paused while ``hpctrain.load`` reads and builds the frame, then on again."""
    import gc
    import json

    import hpctrain

    sweep = tmp_path / "s"
    entries = {}
    for i in range(300):
        _record(sweep / f"{i}_a={i}", "completed" if i % 3 else "failed")
        entries[str(i)] = {"run_dir": f"{i}_a={i}", "overrides": [f"a={i}"], "job_id": f"5_{i}"}
    (sweep / "sweep.json").write_text(json.dumps({"launcher": "local", "runs": entries}))
    load = hpctrain.load  # the API's modules imported before the count (pandas is imported inside)
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        frame = load(sweep).to_pandas()
    finally:
        gc.callbacks.remove(count)
    assert len(frame) == 300 and gc.isenabled()
    # measured: 117 collections before (one full), 2 now: the youngest generation once each time it is on again
    assert len(collections) <= 2 and 2 not in collections, collections


def test_the_status_table_costs_few_calls_a_row(monkeypatch):
    """status prints every row of a 10,000-run sweep: piped, a row is one format call (widths column by column,
    no style list per row, the current directory asked once per table, not once a row)."""
    import io
    from pathlib import Path

    from hpctrain.core.state import Direction, State
    from hpctrain.review import fmt, status
    from hpctrain.review.reader import Sweep
    from hpctrain.review.runs import Run

    def sweep(n):
        rows = [Run(idx=i, name=f"{i}_lr={i}", values={"lr": f"0.00{i}"}, overrides=[f"lr=0.00{i}"],
                    run_dir=Path(f"/s/{i}"), job_id=f"5_{i}", state=State.COMPLETED, step=10, max_steps=10,
                    loss=0.5, elapsed_s=30.0, log=f"/s/.submitit/5_{i}_0_log.out") for i in range(n)]
        return Sweep(dir=Path("/s"), launcher="slurm", runs=rows, swept=["lr"], objective_metric=None,
                     direction=Direction.MIN)

    small, large = sweep(50), sweep(250)
    monkeypatch.delenv("COLUMNS", raising=False)  # pytest-xdist's workers set COLUMNS=80: a table fitted to it costs more
    con = fmt.console(io.StringIO())
    per_row = (_calls(lambda: status.print_table(large, con)) - _calls(lambda: status.print_table(small, con))) / 200
    assert per_row <= 45, per_row  # measured: 36 calls a row; 71 before


def test_reading_ones_own_log_asks_nothing_about_its_folder(tmp_path, monkeypatch):
    """status reads a log per run it judges from its job's files (1,500 of 10,000 in the benchmark): a file of
    the reader's own is taken without a stat of its folder, which only decides about another user's file."""
    import os

    from hpctrain.review import jobs

    log = tmp_path / "1_0_log.err"
    log.write_text("RuntimeError: boom\n")
    stats = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: stats.append(a[0]) or real(*a, **k))
    assert jobs.tail(str(log)) == "RuntimeError: boom\n"
    assert stats == []
