"""A submission's records written in bulk: the same files and states as one write a run, and work that
grows linearly with the number of runs."""

import json
import os
from pathlib import Path

import pytest

from call_count import calls as count_calls
from hpctrain.core import events, manifest
from hpctrain.core.run import RunSpec
from hpctrain.core.state import EventKind, State

pytestmark = pytest.mark.login


def _tags(run_dir: Path):
    return [(e.submission, e.attempt, e.kind) for e in events.events(run_dir)]  # in time order


def _histories(root: Path):
    """Three runs: new, submitted and failed once, and an older record without tags (two submissions)."""
    new, again, legacy = root / "new", root / "again", root / "legacy"
    events.submitted(again)
    events.started(again, job_id="1_0")
    events.failed(again, "RuntimeError: boom", rank=0)
    (legacy / ".hpctrain" / "record").mkdir(parents=True)
    for i, kind in enumerate(["submitted", "started", "submitted"]):
        (legacy / ".hpctrain" / "record" / f"{i + 1:020d}.{kind}.-1.9-ab.json").write_text(json.dumps({"kind": kind}))
    return [new, again, legacy]


def test_the_bulk_writer_leaves_the_records_one_write_a_run_leaves(tmp_path):
    one, bulk = _histories(tmp_path / "one"), _histories(tmp_path / "bulk")
    for run_dir in one:
        events.submitted(run_dir)
    events.submitted_all(bulk)
    for a, b in zip(one, bulk):
        assert _tags(a) == _tags(b)
        ra, rb = events.read(a), events.read(b)
        assert rb.state is State.QUEUED and (ra.state, ra.retries, ra.attempts) == (rb.state, rb.retries, rb.attempts)
    assert [e.submission for e in events.events(bulk[2]) if e.kind is EventKind.SUBMITTED][-1] == 3
    newest = events.events(bulk[0])[-1]
    assert newest.data()["kind"] == "submitted" and newest.data()["host"] and newest.rank == -1
    assert not [n for n in os.listdir(events.record_dir(bulk[0])) if n.endswith(".tmp")]


def test_the_bulk_writer_gives_files_the_modes_single_writes_give(tmp_path):
    events.submitted(tmp_path / "one")
    events.submitted_all([tmp_path / "bulk"])
    mode = {name: os.stat(events.events(tmp_path / name)[0].path).st_mode for name in ("one", "bulk")}
    assert mode["one"] == mode["bulk"]


def test_a_run_dir_nested_below_the_sweep_dir_is_made(tmp_path):
    events.submitted_all([tmp_path / "a" / "b" / "run"])
    assert events.read(tmp_path / "a" / "b" / "run").state is State.QUEUED


def _submission(sweep: Path, n: int) -> None:
    specs = [RunSpec(i, (f"lr={i % 40}", f"seed={i // 40}"), sweep / f"{i}_lr={i % 40},seed={i // 40}", 10)
             for i in range(n)]
    events.submitted_all(s.run_dir for s in specs)

    def add(m: manifest.Manifest) -> None:
        m.submissions.append(manifest.SubmissionRecord(runs=[s.idx for s in specs]))
        for s in specs:
            m.runs[s.idx] = manifest.RunEntry(s)

    manifest.update(sweep, add)
    manifest.add_job_ids(sweep, {s.idx: f"7_{s.idx}" for s in specs}, ["7"])


def test_a_submission_s_records_grow_linearly(tmp_path):
    small, large = (count_calls(lambda n=n: _submission(tmp_path / str(n), n)) for n in (250, 1000))
    assert large <= 4.4 * small, (small, large)  # 4x the runs: at most 4x the work (+10 %)
    m = manifest.read(tmp_path / "1000")
    assert len(m.runs) == 1000 and m.runs[999].job_id == "7_999" and m.submissions[-1].job_ids == ["7"]
    assert events.read(m.runs[999].spec.run_dir).state is State.QUEUED


def test_job_ids_set_on_the_raw_json_read_as_the_typed_update_reads_them(tmp_path):
    for name in ("typed", "raw"):
        sweep = tmp_path / name
        specs = [RunSpec(i, (f"x={i}",), sweep / str(i)) for i in range(4)]

        def add(m: manifest.Manifest, specs=specs) -> None:
            m.submissions.append(manifest.SubmissionRecord(runs=[0, 1, 2, 3], job_ids=["5"]))
            m.runs.update({s.idx: manifest.RunEntry(s) for s in specs})

        manifest.update(sweep, add)
    ids = {0: "8_0", 1: "8_1", 3: "9"}

    def typed(m: manifest.Manifest) -> None:
        m.last_submission().job_ids = sorted(set(m.last_submission().job_ids) | {"8", "9"})
        for idx, job_id in ids.items():
            m.runs[idx].job_id = job_id

    manifest.update(tmp_path / "typed", typed)
    manifest.add_job_ids(tmp_path / "raw", ids, ["8", "9"])
    a, b = manifest.read(tmp_path / "typed"), manifest.read(tmp_path / "raw")
    assert a.submissions[-1].job_ids == b.submissions[-1].job_ids == ["5", "8", "9"]
    assert {i: e.job_id for i, e in a.runs.items()} == {i: e.job_id for i, e in b.runs.items()}
    assert json.loads((tmp_path / "raw" / "sweep.json").read_text())["runs"]["2"]["job_id"] is None


def test_the_bulk_writer_skips_the_per_write_fold(tmp_path):
    n = 200
    bulk = count_calls(lambda: events.submitted_all(tmp_path / f"b{i}" for i in range(n))) / n
    one = count_calls(lambda: [events.submitted(tmp_path / f"o{i}") for i in range(n)]) / n
    assert bulk <= 100 and one >= 3 * bulk, (bulk, one)  # measured: 75 calls a run against 375
    ids = count_calls(lambda: manifest.add_job_ids(tmp_path, {}, ["1"]))
    manifest.update(tmp_path, lambda m: m.runs.update({i: manifest.RunEntry(RunSpec(i, (), tmp_path / f"b{i}"))
                                                       for i in range(n)}))
    per_run = (count_calls(lambda: manifest.add_job_ids(tmp_path, {i: f"1_{i}" for i in range(n)}, ["1"])) - ids) / n
    assert per_run <= 20, per_run  # a load, a set, a dump: no typed parse of every run (that took 80)
