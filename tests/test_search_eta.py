"""A search's ETA comes from its trials' measured pace (issue 29 item 6): the units still to run, as the scheduler
runs them, each its time besides its steps plus its steps at the seconds a step takes inside running units,
spread over the workers. The figure on the README's ASHA example (ETA against the real time left) is measured
by benchmarks/search_eta.py."""

import io

import pytest

from hpctrain.core import events
from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.run import RunSpec
from hpctrain.submit.progress import Progress

ASHA = {"scheduler": "asha", "min_steps": 20, "eta": 3, "max_steps": 540, "n_trials": 27}
HYPERBAND = dict(ASHA, scheduler="hyperband")


def test_hyperband_steps_left_rung_by_rung_with_the_share_promoted_as_measured():
    from hpctrain.search.eta import Trial, steps_left

    # nothing known yet: 27 trials to rung 20, 27/3 to 60, 27/9 to 180, 27/27 to 540
    assert abs(steps_left([], 27, HYPERBAND) - (27 * 20 + 9 * 40 + 3 * 120 + 1 * 360)) < 1e-9
    # 6 at rung 20, of which 4 went on (measured 4/6 > 1/3): two running to 60 (at 30 and 40), two paused there
    trials = [Trial(20, False, True), Trial(20, True), Trial(30, False), Trial(40, False), Trial(60, False, True),
              Trial(60, False, True)]
    at_60 = 27 * 4 / 6  # 18 expected to reach rung 60
    want = (27 - 6) * 20 + (at_60 - 2) * 40 - (10 + 20) + (at_60 / 3) * 120 + (at_60 / 9) * 360
    assert abs(steps_left(trials, 27, HYPERBAND) - want) < 1e-9
    assert steps_left([Trial(100, False), Trial(540, True)], 3, {"scheduler": "pbt", "max_steps": 540}) == 440 + 540


def test_a_search_progress_eta_times_each_unit_from_the_trials_records(tmp_path, monkeypatch):
    """No scheduler, one worker, 3 trials: trial 0 took 37 s for its 540 steps, 0.05 s a step inside (its
    progress writes), so 10 s besides: the worker's first unit, its imports, which the next units do not pay;
    trial 1 started 12 s ago: 25 s of its unit are left, then trial 2's 27 s. A speed over all the time (580
    steps in 49 s) says 88 s."""
    clock = [99.0]
    monkeypatch.setattr(events.time, "time_ns", lambda: int(clock[0] * 1e9))  # the records' times
    specs = []
    for i in range(2):
        (tmp_path / f"{i}").mkdir()
        specs.append(RunSpec(i, (f"lr={i}",), tmp_path / f"{i}", 540))
        events.submitted(specs[i].run_dir)
    search = {"scheduler": "none", "max_steps": 540, "n_trials": 3, "workers": 1}
    progress = Progress([], stream=io.StringIO(), clock=lambda: clock[0],
                        discover=lambda: (specs, {i: f"lr={i}" for i in range(2)}, 3, dict(search)))
    progress.wall = lambda: clock[0]  # the records' clock: a running unit's time so far

    def at(t, run, step=None, kind=None):
        clock[0] = t
        if kind is not None:
            kind(run.run_dir)
        if step is not None:
            write_json_atomic(run.run_dir / "metrics.json", {"step": step, "max_steps": 540, "updated": t})
        progress.update(force=True)

    at(100.0, specs[0], kind=events.started)
    at(110.0, specs[0], 10)
    at(115.0, specs[0], 110)  # 100 steps in 5 s inside the unit
    at(137.0, specs[0], 540, kind=events.completed)
    at(137.0, specs[1], kind=events.started)
    at(148.0, specs[1], 20)
    at(149.0, specs[1], 40)
    assert progress.eta_s() == pytest.approx(25.0 + 27.0)


def test_asha_steps_left_as_the_rule_decides_not_a_share_of_a_rung():
    from hpctrain.search.eta import Trial, steps_left

    # every trial started; rung 180 has two trials, both ended there, and a third on its way (at 100 of 180):
    # once it arrives, the top 1/3 of the three is one that ended: nothing more is promoted. 80 steps left,
    # where a third of a rung's trials going on (or the share measured) counts one more to 540 (360 steps).
    trials = [Trial(180, True), Trial(180, True), Trial(100, False), Trial(60, False, True)] + [Trial(20, True)] * 5
    assert steps_left(trials, 9, dict(ASHA, workers=2)) == 80
    # async ASHA goes on with a rung's best paused trial once it is in the top third: 3 of 3 at rung 20, the
    # best (the one that went furthest) at 60 paused; played on, at least the rungs' top thirds go on
    early = [Trial(60, False, True), Trial(20, True), Trial(20, True)]
    assert steps_left(early, 27, ASHA) >= 24 * 20 + 8 * 40 + 3 * 120 + 360  # the top 9, 3, 1 go on at least
    assert steps_left(early, 27, ASHA) == steps_left(list(early), 27, ASHA)  # seeded: the same state, same ETA
    assert steps_left([Trial(540, True)] + [Trial(20, True)] * 26, 27, ASHA) == 0


def test_the_pace_is_the_steps_measured_inside_units_and_a_units_time_besides_them():
    from hpctrain.search.eta import Pace, Span, Stride, pace

    # three units of 20 steps of 3 s each, 0.05 s a step inside: 2 s a unit besides its steps; a worker's first
    # unit (7.7 s: the imports) is one of four: the median leaves it out
    spans = [Span(0.0, 7.7, 20), Span(7.7, 10.7, 20), Span(10.7, 13.7, 20), Span(13.7, 16.7, 20)]
    strides = [Stride(5.0, 0.5, 10), Stride(9.0, 0.5, 10), Stride(12.0, 0.5, 10), Stride(15.0, 0.5, 10)]
    assert pace(spans, strides) == Pace(pytest.approx(0.05), pytest.approx(2.0))
    # the last third of the time: the machine got 4 times slower from 60 s on; the older strides left out
    late = strides + [Stride(70.0, 2.0, 10), Stride(80.0, 2.0, 10), Stride(90.0, 2.0, 10)]
    assert pace([], late).step_s == pytest.approx(0.2)
    # an app that writes no progress within a unit: the units' time over their steps (the last three: the
    # first is outside the last third of the time)
    assert pace(spans, []) == Pace(pytest.approx(9.0 / 60))
    # the first units of a search on a quiet machine, no progress write seen inside one yet: the worker's first
    # unit (its imports) is left out, not averaged in (0.063 s a step, 5 times the ETA, before)
    first = [Span(0.0, 3.33, 20), Span(3.4, 3.64, 20), Span(3.7, 3.89, 20)]
    assert pace(first, []) == Pace(pytest.approx(0.43 / 40))
    # one worker, two units ended: its first one (the imports) is left out, the median of two would not do it
    assert pace(first[:2], [], first_units=1) == Pace(pytest.approx(0.24 / 20))
    assert pace(first[:1], [], first_units=1) is None  # nothing but the imports' unit measured yet
    # and the time a unit takes besides its steps is not the first unit's either
    assert pace(spans[:2], strides[:2], first_units=1) == Pace(pytest.approx(0.05), pytest.approx(2.0))
    assert pace([], []) is None


def test_asha_eta_plays_the_units_on_the_workers_with_their_time_besides_the_steps():
    from hpctrain.search.eta import Pace, Trial, eta_s, steps_left

    # the tail: every trial ended but one on its last stretch (180 to 540, 0.05 s a step); 4 workers, 3 idle:
    # 18 s, not the 360 steps at the 4 workers' speed together (4.5 s)
    tail = [Trial(540, True)] + [Trial(20, True)] * 25 + [Trial(180, False, running_s=0.0)]
    assert eta_s(tail, 27, dict(ASHA, workers=4), Pace(0.05)) == pytest.approx(18.0)
    # the time it ran counts: 30 s into a unit expected to take 2 + 18 s, at least its steps left (360 - 100)
    tail2 = tail[:-1] + [Trial(280, False, running_s=10.0)]
    assert eta_s(tail2, 27, dict(ASHA, workers=4), Pace(0.05, 2.0)) == pytest.approx(max(0.05 * 260, 20.0 - 10.0))
    # one worker: each unit's 2 s besides its steps count once a unit; the steps the same as played in steps
    early = [Trial(20, False, True), Trial(20, True), Trial(20, True)]
    steps = steps_left(early, 27, ASHA)
    timed = eta_s(early, 27, ASHA, Pace(0.05, 2.0))
    assert 0.05 * steps + 2.0 * 24 <= timed <= 0.05 * steps + 2.0 * (24 + 24)  # 24 to start, some promotions
    assert eta_s(early, 27, ASHA, Pace(0.05)) == pytest.approx(0.05 * steps)


def test_random_search_and_pbt_eta_spread_their_units_over_the_workers():
    from hpctrain.search.eta import Pace, Trial, eta_s

    p = Pace(0.1, 1.0)  # a unit of 100 steps: 11 s
    none = {"scheduler": "none", "max_steps": 100, "workers": 2}
    # 2 workers: one trial 5 s into its unit but at step 0 (its 100 steps left: 10 s), one at 50 of 100 2 s in
    # (11 - 2 = 9 s left, more than its 5 s of steps); 3 to come: on the worker free at 9 s (20), the one at
    # 10 s (21), then at 20 s (31)
    trials = [Trial(0, False, running_s=5.0), Trial(50, False, running_s=2.0)]
    assert eta_s(trials, 5, none, p) == pytest.approx(31.0)
    # PBT: a population of 2 in intervals of 25 on 2 workers, each at 50 paused: 2 intervals of 3.5 s each
    pbt = {"scheduler": "pbt", "max_steps": 100, "interval": 25, "workers": 2}
    assert eta_s([Trial(50, False, True)] * 2, 2, pbt, p) == pytest.approx(7.0)
    # Hyperband: the steps rung by rung as before, each unit still to start with its time besides
    assert eta_s([], 27, dict(HYPERBAND, workers=1), Pace(1.0)) == pytest.approx(27 * 20 + 9 * 40 + 3 * 120 + 360)
    assert eta_s([], 27, dict(HYPERBAND, workers=1), Pace(0.0, 1.0)) is None
    assert eta_s([], 27, dict(HYPERBAND, workers=1), Pace(1.0, 1.0)) == pytest.approx(1620 + 27 + 9 + 3 + 1)


def test_a_trials_units_from_its_records():
    from hpctrain.search.eta import Span, units_of

    records = [(0.0, "submitted", None), (1.0, "started", None), (4.0, "paused", 20), (9.0, "started", None),
               (10.0, "failed", None), (11.0, "started", None), (15.0, "paused", 60), (20.0, "pruned", 60)]
    # the failed attempt is no unit; the study's prune of the paused trial (no start before it) neither
    assert units_of(records) == [Span(1.0, 4.0, 20), Span(11.0, 15.0, 40)]


def test_the_eta_shown_is_rounded_up_as_a_countdown(tmp_path, monkeypatch):
    """2.2 s left reads "ETA 3s" (truncated it read 2 s, and "ETA 0s" while the last trial still ran)."""
    run = RunSpec(0, ("lr=1",), tmp_path / "0", 10)
    progress = Progress([run], stream=io.StringIO())
    for left, shown in ((2.2, "ETA 3s"), (0.3, "ETA 1s"), (59.5, "ETA 1m00s"), (120.0, "ETA 2m00s")):
        monkeypatch.setattr(Progress, "eta_s", lambda self, left=left: left)
        assert progress.counts_text().endswith(shown), (left, progress.counts_text())
