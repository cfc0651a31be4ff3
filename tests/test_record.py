"""The run record: transitions as files, the fold, and its tolerance of garbage."""

import itertools
import json
import os
from pathlib import Path

import pytest

from hpctrain.core import events, summary
from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.state import Event, State, fold

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra


def _events(tmp_path: Path, steps):
    """Write (kind, rank, details) steps with strictly increasing times; return their Events."""
    out = []
    for i, (kind, rank, details) in enumerate(steps):
        path = tmp_path / f"{i:020d}.{kind}.{rank}.x{i}.json"
        path.write_text(json.dumps({"kind": kind, **details}))
        out.append(Event(i, kind, rank, str(path)))
    return out


def _retimed(written):
    return [Event(t, e.kind, e.rank, e.path) for t, e in enumerate(written)]


def test_transitions_lead_to_their_states(tmp_path):
    run = tmp_path / "run"
    assert events.read(run).state is None
    events.submitted(run)
    assert events.read(run).state is State.QUEUED
    events.started(run, job_id="7_0")
    rs = events.read(run)
    assert rs.state is State.RUNNING and rs.job_id == "7_0" and rs.starts == 1
    events.failed(run, "RuntimeError: boom", rank=0)
    assert events.read(run).state is State.FAILED
    assert events.retry_allowed(run, max_retries=1) == 1
    events.retrying(run, 1, 1)
    assert events.read(run).state is State.RETRYING
    events.started(run, job_id="7_0")
    events.requeued(run)
    assert events.read(run).state is State.REQUEUED
    events.started(run, job_id="7_0")
    events.failed(run, "ValueError: boom again", rank=0)
    rs = events.read(run)
    assert rs.state is State.FAILED and rs.retries == 1 and rs.restarts == 2 and rs.error == "ValueError: boom again"
    assert events.retry_allowed(run, max_retries=1) is None  # budget used
    events.submitted(run)  # a rerun starts afresh
    assert events.read(run).state is State.QUEUED and events.read(run).retries == 0
    events.started(run)
    events.completed(run)
    assert events.read(run).state is State.COMPLETED and events.is_completed(run)


@pytest.mark.parametrize("kind, state", [("cancelled", State.CANCELLED), ("pruned", State.PRUNED),
                                         ("timed_out", State.TIMEOUT)])
def test_final_states(tmp_path, kind, state):
    events.submitted(tmp_path)
    events.started(tmp_path)
    getattr(events, kind)(tmp_path)
    assert events.read(tmp_path).state is state


def test_each_transition_is_one_new_file(tmp_path):
    events.started(tmp_path, rank=0)
    events.failed(tmp_path, "x", rank=1)
    names = os.listdir(events.record_dir(tmp_path))
    assert len(names) == 2 and all(events.parse_name(n) for n in names)


def test_garbage_and_torn_files_are_skipped_the_rest_stands(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path, job_id="5")
    events.failed(tmp_path, "RuntimeError: own", rank=1)
    d = Path(events.record_dir(tmp_path))
    (d / "not-an-event.json").write_text("{")
    (d / ".00000000000000000001.failed.0.tmp").write_text("")  # a temp file of a writer that died
    (d / "99999999999999999999.completed.x.y.json").write_text("{}")  # bad rank: skipped
    torn = d / "00000000000000000002.failed.0.zz.json"  # a torn file under a good name counts, details lost
    torn.write_text('{"kind": "fail')
    rs = events.read(tmp_path)
    assert rs.state is State.FAILED and rs.error == "RuntimeError: own" and rs.failed_rank == 1
    assert rs.starts == 1


def test_own_error_wins_over_fallout_in_any_order(tmp_path):
    own = ("failed", 1, {"error": "torch.OutOfMemoryError: CUDA out of memory", "fallout": False})
    fallout = ("failed", 0, {"error": "RuntimeError: Connection closed by peer", "fallout": True})
    batch = ("failed", -1, {"error": "the job's tasks ended with exit code 1", "fallout": False})
    for order in itertools.permutations([own, fallout, batch]):
        rs = fold(_events(tmp_path, [("submitted", -1, {}), ("started", 0, {})] + list(order)))
        assert rs.error.startswith("torch.OutOfMemoryError") and rs.failed_rank == 1


def test_fallout_is_recognised():
    assert events.is_fallout("RuntimeError: [../third_party/gloo/...] Connection closed by peer [127.0.0.1]:1234")
    assert not events.is_fallout("ValueError: bad lr")


def _interleavings(a, b):
    """Every merge of two sequences that keeps each one's own order."""
    n = len(a) + len(b)
    for positions in itertools.combinations(range(n), len(a)):
        ia, ib, out = iter(a), iter(b), []
        for i in range(n):
            out.append(next(ia) if i in positions else next(ib))
        yield out


@pytest.mark.parametrize("rank0, rank1, expected", [
    ([("started", 0, {}), ("completed", 0, {})], [], State.COMPLETED),
    ([("started", 0, {}), ("failed", 0, {"error": "Connection reset by peer", "fallout": True})],
     [("failed", 1, {"error": "ValueError: rank 1 alone", "fallout": False})], State.FAILED),
    ([("started", 0, {}), ("completed", 0, {})], [("failed", 1, {"error": "late", "fallout": True})],
     State.COMPLETED),
    ([("started", 0, {}), ("timeout", 0, {"error": "timed-out too many times"})],
     [("failed", 1, {"error": "Connection closed by peer", "fallout": True})], State.TIMEOUT),
    ([("started", 0, {})], [("failed", 1, {"error": "ValueError: x", "fallout": False})], State.FAILED),
    ([("started", 0, {})], [("pruned", 1, {"step": 5})], State.PRUNED),
])
def test_fold_is_the_same_for_every_interleaving_of_two_ranks(tmp_path, rank0, rank1, expected):
    head = [("submitted", -1, {}), ("started", 0, {}), ("failed", 0, {"error": "ValueError: first try"}),
            ("retrying", -1, {"attempt": 1, "of": 2})]
    results = set()
    for k, merged in enumerate(_interleavings(rank0, rank1)):
        sub = tmp_path / str(k)
        sub.mkdir()
        rs = fold(_events(sub, head + merged))
        results.add((rs.state, rs.error, rs.failed_rank, rs.retries, rs.starts))
    assert len(results) == 1, results
    state, error, failed_rank, retries, starts = results.pop()
    assert state is expected and retries == 1 and starts == 2
    if expected is State.FAILED:
        assert error.startswith("ValueError") and failed_rank == 1


def test_summary_takes_status_from_the_record(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path)
    summary.write(tmp_path, step=3, metrics={"train/loss": 1.0})
    events.failed(tmp_path, "ValueError: bad", rank=2)
    written = summary.write(tmp_path, status="completed")  # a caller cannot overrule the record
    assert written["status"] == "failed" and written["error"] == "ValueError: bad" and written["failed_rank"] == 2
    assert summary.read(tmp_path)["step"] == 3


def test_runs_without_a_record_fall_back_to_metrics_json(tmp_path):
    write_json_atomic(tmp_path / "metrics.json", {"status": "completed"})
    assert events.is_completed(tmp_path)


@pytest.mark.parametrize("value, expected", [
    (0.25, {"value": 0.25}), (3, {"value": 3.0}), ({"acc": 0.9, "name": "x"}, {"acc": 0.9}),
    ({"status": "completed", "step": 4, "metrics": {"val/loss": 1.5}}, {"val/loss": 1.5}),
    (None, {}), (True, {}), ("text", {}),
])
def test_return_values_as_metrics(value, expected):
    assert summary.numbers(value) == expected


def test_a_requeue_never_erases_a_final_state(tmp_path):
    """USR2 during the final save: the requeue written before the completion, or after it, loses to it;
    a packed run cancelled after its USR2 stays cancelled; a final record takes no requeue at all."""
    done = tmp_path / "done"
    events.submitted(done)
    events.started(done)
    assert events.requeued(done) is not None
    events.completed(done)
    assert events.read(done).state is State.COMPLETED
    assert events.requeued(done) is None  # nothing written: the caller must not requeue
    assert events.read(done).state is State.COMPLETED and events.is_completed(done)
    cancelled = tmp_path / "cancelled"
    events.submitted(cancelled)
    events.started(cancelled)
    events.requeued(cancelled)  # the packed child checkpointed first
    events.cancelled(cancelled)  # then `hpctrain cancel --run N`
    assert events.read(cancelled).state is State.CANCELLED
    events.started(cancelled)  # even a start that slipped through does not revive it
    assert events.read(cancelled).state is State.CANCELLED


def test_a_rerun_after_a_failure_is_a_new_attempt(tmp_path):
    """``python -m hpctrain`` twice in one dir: started, failed, started reads running, not failed."""
    events.started(tmp_path)
    events.failed(tmp_path, "ValueError: first", rank=0)
    assert events.read(tmp_path).state is State.FAILED
    events.started(tmp_path)
    rs = events.read(tmp_path)
    assert rs.state is State.RUNNING and rs.error is None and rs.restarts == 1


def test_a_packed_run_out_of_requeues_ends_timeout(tmp_path):
    """The child recorded requeued; submitit then refused to requeue (max_num_timeout used up)."""
    events.submitted(tmp_path)
    events.started(tmp_path)
    events.requeued(tmp_path)
    events.timed_out(tmp_path, "Job not requeued because: timed-out too many times.")
    rs = events.read(tmp_path)
    assert rs.state is State.TIMEOUT and rs.requeues == 1


def test_a_retry_recorded_twice_is_counted_once(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path)
    events.failed(tmp_path, "ValueError: x", rank=0)
    events.retrying(tmp_path, 1, 2)
    events.retrying(tmp_path, 1, 2)
    assert events.read(tmp_path).retries == 1 and events.retry_allowed(tmp_path, 2) is None  # retrying, not failed
