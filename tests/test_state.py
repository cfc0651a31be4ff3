"""The one state vocabulary: State, EventKind and Direction, their JSON forms, and the sacct table."""

import json

import pytest

from hpctrain.core.state import ACTIVE, FINAL, RESTING, Direction, Event, EventKind, State
from hpctrain.review.fmt import STATE_STYLE
from hpctrain.slurm.parse import SACCT_FINAL

pytestmark = pytest.mark.login


def test_states_are_active_or_final_and_json_keeps_their_text():
    assert ACTIVE | FINAL | RESTING == set(State) and not ACTIVE & FINAL and not (ACTIVE | FINAL) & RESTING
    assert json.dumps({State.COMPLETED: [State.FAILED]}) == '{"completed": ["failed"]}'
    assert f"{State.RUNNING}" == "running" and State.parse("pruned") is State.PRUNED and State.parse("nope") is None


def test_every_state_has_a_style_and_every_sacct_state_maps_to_a_final_one():
    assert set(STATE_STYLE) == set(State)
    assert all(isinstance(s, State) and s in FINAL for s in SACCT_FINAL.values())


@pytest.mark.parametrize("spelling, expected", [
    ("min", Direction.MIN), ("max", Direction.MAX), ("minimize", Direction.MIN), ("maximize", Direction.MAX),
    ("MAXIMIZE", Direction.MAX), ("StudyDirection.MINIMIZE", Direction.MIN), (Direction.MAX, Direction.MAX),
])
def test_direction_reads_every_spelling(spelling, expected):
    assert Direction.parse(spelling) is expected


def test_direction_reads_optunas_enum_and_round_trips():
    optuna = pytest.importorskip("optuna")
    assert Direction.parse(optuna.study.StudyDirection.MAXIMIZE) is Direction.MAX
    assert Direction.parse(optuna.study.StudyDirection.MINIMIZE) is Direction.MIN
    for d in Direction:
        assert Direction.parse(d.optuna) is d and Direction.parse(d.value) is d
    with pytest.raises(ValueError, match="expected min, max"):
        Direction.parse("sideways")


def test_direction_orders_best_first():
    assert sorted([3.0, 1.0, 2.0], key=lambda v: Direction.MAX.sign * v) == [3.0, 2.0, 1.0]
    assert Direction.MIN.better(1.0, 2.0) and not Direction.MAX.better(1.0, 2.0)


def test_event_kinds_are_the_file_names():
    e = Event(1, "requeued", 0, "x")  # the text of a file name reads as its kind
    assert e.kind is EventKind.REQUEUED
    with pytest.raises(ValueError):
        Event(1, "paused-ish", 0, "x")
