"""A search's ETA comes from its trials' measured speed (issue 29 item 6): the steps still to train, as the
scheduler runs trials on average, at the steps per second trained so far. The figure on the README's ASHA
example (ETA against the real time left) is measured by benchmarks/search_eta.py."""

import io

from hpctrain.core import events, summary
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


def test_a_search_progress_eta_is_the_steps_left_at_the_measured_speed(tmp_path):
    specs = []
    for i in range(3):
        run_dir = tmp_path / f"{i}"
        run_dir.mkdir()
        events.submitted(run_dir)
        specs.append(RunSpec(i, (f"lr={i}",), run_dir, 540))
    clock = [0.0]
    stream = io.StringIO()
    progress = Progress([], stream=stream, clock=lambda: clock[0],
                        discover=lambda: (specs, {i: f"lr={i}" for i in range(3)}, 27, dict(ASHA)))
    for spec in specs:
        events.started(spec.run_dir, job_id="1")
    clock[0] = 5.0
    progress.update(force=True)  # the trials are seen started at 5 s: the speed is measured from then
    for spec in specs[:2]:
        summary.write(spec.run_dir, step=20, max_steps=540)
        events.paused(spec.run_dir, step=20)
    summary.write(specs[2].run_dir, step=20, max_steps=540)
    events.pruned(specs[2].run_dir, step=20)
    clock[0] = 15.0  # 60 steps in 10 s: 6 steps/s
    progress.update(force=True)
    from hpctrain.search.eta import Trial, steps_left

    left = steps_left([Trial(20, False, True)] * 2 + [Trial(20, True)], 27, ASHA)  # the steps left, as ASHA decides
    assert abs(progress.eta_s() - left / 6.0) < 1e-6
    assert f"ETA {int(left / 6.0) // 60}m" in stream.getvalue().splitlines()[-1]


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


def test_the_speed_is_the_last_third_of_the_time_so_a_machine_slowed_down_is_followed():
    from hpctrain.search.eta import Trial, eta_s, speed

    # 300 steps in the first 30 s, then 30 in the next 30 s (the machine got busy): 1 step/s, not 5.5
    assert speed([(10.0, 100), (30.0, 300), (60.0, 330)]) == 1.0
    assert speed([(60.0, 330)]) == 5.5  # no sample that old: the whole time
    assert speed([(10.0, 100), (30.0, 330), (60.0, 330)]) == 5.5  # nothing trained since: the whole time
    trials = [Trial(330, False)]
    assert eta_s(trials, 1, {"scheduler": "none", "max_steps": 540}, 60.0, [(10.0, 100), (30.0, 300)]) == 210.0
