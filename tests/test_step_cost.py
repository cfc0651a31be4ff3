"""What the trainer does per step and per log step beyond a plain loop, counted in function calls (a count
of work that does not depend on the machine's load; issue 31's figure is instructions under cachegrind,
``benchmarks/trainer_overhead.py --instructions``)."""

import json
import sys
import time

from hpctrain.core import summary


def _calls(fn) -> int:
    """Python and C function calls made by ``fn()``."""
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def test_a_log_step_s_metrics_json_write_is_cheap_and_stays_readable(tmp_path):
    """metrics.json is written on every log step: the C encoder (not ``indent``'s Python one), no pathlib."""
    values = {"train/loss": 0.5, "train/lr": 1e-3, "perf/samples_per_s": 1234.5, "perf/step_time_s": 0.001,
              "train/grad_norm": 1.2}
    summary.write(tmp_path, step=1, max_steps=300, started=time.time(), world_size=1, host="x", pid=1)
    summary.write(tmp_path, step=1, metrics=values)
    calls = _calls(lambda: summary.write(tmp_path, step=2, metrics=values))
    assert calls <= 300, calls  # 583 with json.dumps(indent=1) and pathlib joins
    text = (tmp_path / "metrics.json").read_text()
    assert json.loads(text) == {**summary.read(tmp_path), "step": 2}
    assert text.splitlines()[1] == ' "host": "x",' and len(text.splitlines()) == 10, text  # a key a line
