"""A run's life inside the allocation (hpctrain/job/lifecycle.py): one decision table, each attempt ended
once, the current lifecycle found by the app and the trainer. Real records in a tmp dir."""

from pathlib import Path
from typing import List

import pytest

from hpctrain.core import events, summary
from hpctrain.core.state import State
from hpctrain.job import lifecycle
from hpctrain.job.lifecycle import DECISIONS, Lifecycle, Outcome

pytestmark = pytest.mark.login


def kinds(run_dir: Path) -> List[str]:
    return [e.kind.value for e in events.events(run_dir)]


def test_the_table_decides_every_outcome_and_only_a_failure_or_a_hang_is_retried():
    assert set(DECISIONS) == set(Outcome)
    assert {o for o, d in DECISIONS.items() if d.retried} == {Outcome.FAILED, Outcome.HUNG}
    assert {o for o, d in DECISIONS.items() if d.every_rank} == {Outcome.FAILED, Outcome.TIMED_OUT, Outcome.HUNG}


def test_an_attempt_is_ended_once_the_second_end_writes_no_event(tmp_path):
    run = tmp_path / "run"
    events.submitted(run)
    life = Lifecycle(run, job_id="7")
    assert life.begin(trial=3)
    assert life.end(Outcome.PRUNED, step=10, reason="the search's pruner") is State.PRUNED  # the trainer's
    # the worker settles the same trial: its summary fields are kept, the state it decided stands
    assert life.end(Outcome.PRUNED, step=None, reason="the pruner stopped it", trial=3) is State.PRUNED
    assert life.end(Outcome.COMPLETED, trial=3) is State.PRUNED
    assert kinds(run) == ["submitted", "started", "pruned"]
    assert events.read(run).state is State.PRUNED and (summary.read(run) or {})["trial"] == 3


def test_ranks_write_what_the_table_gives_them(tmp_path):
    run = tmp_path / "run"
    events.submitted(run)
    Lifecycle(run, rank=0).begin()
    assert Lifecycle(run, rank=1).begin()  # its start is rank 0's
    Lifecycle(run, rank=1).end(Outcome.COMPLETED)  # rank 0 records the completion
    assert kinds(run) == ["submitted", "started"]
    Lifecycle(run, rank=1).end(Outcome.FAILED, error="RuntimeError: rank 1's own")
    Lifecycle(run, rank=0, writes=False).end(Outcome.FAILED, error="not this process's to write")
    assert kinds(run) == ["submitted", "started", "failed"] and "rank 1's own" in (events.read(run).error or "")


def test_a_completed_run_is_not_begun_again(tmp_path):
    run = tmp_path / "run"
    events.submitted(run)
    first = Lifecycle(run, app="app@1")
    first.begin()
    first.end(Outcome.COMPLETED)
    assert not Lifecycle(run, app="app@1").begin()
    assert Lifecycle(run, app="app@2").begin()  # other code: run again
    assert kinds(run) == ["submitted", "started", "completed", "started"]


def test_a_requeue_of_a_final_run_is_refused(tmp_path):
    run = tmp_path / "run"
    events.submitted(run)
    life = Lifecycle(run)
    life.begin()
    assert life.requeue()
    life.begin()
    life.end(Outcome.COMPLETED)
    assert not lifecycle.requeue(run)
    assert kinds(run) == ["submitted", "started", "requeued", "started", "completed"]


def test_the_current_lifecycle_is_the_one_made_active():
    assert lifecycle.current() is None
    life = Lifecycle(Path("/nonexistent"))
    with lifecycle.active(life):
        assert lifecycle.current() is life
    assert lifecycle.current() is None
