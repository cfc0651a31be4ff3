"""A search's ETA comes from its trials' measured speed (issue 29 item 6): the steps still to train, as the
scheduler runs trials on average, at the steps per second trained so far. The figure on the README's ASHA
example (ETA against the real time left) is measured by benchmarks/search_eta.py."""

import io

from hpctrain.core import events, summary
from hpctrain.core.run import RunSpec
from hpctrain.submit.progress import Progress

ASHA = {"scheduler": "asha", "min_steps": 20, "eta": 3, "max_steps": 540, "n_trials": 27}


def test_an_asha_trial_is_expected_to_train_each_rung_times_the_share_promoted_to_it():
    from hpctrain.search import eta

    # rungs 20, 60, 180, 540: 20 + 40/3 + 120/9 + 360/27 = 60 steps a trial on average
    assert abs(eta.expected_left(0, ASHA) - 60.0) < 1e-9
    assert abs(eta.expected_left(20, ASHA, paused=True) - (40 / 3 + 120 / 9 + 360 / 27)) < 1e-9  # if promoted
    assert abs(eta.expected_left(20, ASHA) - (40 + 120 / 3 + 360 / 9)) < 1e-9  # promoted: running to rung 60
    assert abs(eta.expected_left(30, ASHA) - (30 + 120 / 3 + 360 / 9)) < 1e-9  # running to rung 60
    assert eta.expected_left(540, ASHA) == 0
    assert eta.expected_left(100, {"scheduler": "pbt", "max_steps": 540}) == 440  # PBT: every trial to the end


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
    paused_left = 40 / 3 + 120 / 9 + 360 / 27  # each of the two paused at rung 20: promoted with chance 1/3
    left = 2 * paused_left + 24 * 60.0  # and 24 trials to come, 60 steps each on average
    assert abs(progress.eta_s() - left / 6.0) < 1e-6
    assert f"ETA {int(left / 6.0) // 60}m" in stream.getvalue().splitlines()[-1]
