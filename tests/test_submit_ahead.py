"""The cluster's answers a Slurm submission needs (scontrol's limits and partitions, sacctmgr's queue cap)
are asked at the launcher's setup, in the background, and each once: not one after the other after the plan
(issue 31 item 3: the sacctmgr round alone was ~0.3 s of a 1,000-point command). Counted by order and calls,
not by time: the same on a loaded machine."""

import json
import subprocess
import sys

from hpctrain.slurm.ahead import Ahead

# python -m hpctrain in its own interpreter, each query function and the plan spied on (called through)
DRIVER = """
import json, sys, threading
from hpctrain.slurm import query
import hpctrain.submit.launcher as launcher
events = []
def spy(owner, name):
    real = getattr(owner, name)
    def wrapper(*a, **k):
        events.append((name, threading.current_thread() is threading.main_thread()))
        return real(*a, **k)
    setattr(owner, name, wrapper)
for name in ("array_limits", "partitions", "max_submit_jobs"):
    spy(query, name)
spy(launcher, "plan_runs")
try:
    from hpctrain.slurm.ahead import Ahead
    real_ask = Ahead.ask
    def ask(self, name, fn):
        events.append(("ask " + name, True))
        return real_ask(self, name, fn)
    Ahead.ask = ask
except ImportError:  # the code before the change: nothing asked ahead
    pass
from hpctrain.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("EVENTS " + json.dumps(events))
"""


def test_cluster_questions_are_asked_before_the_plan_and_once(tmp_path):
    argv = ["-m", "lr=1e-3,1e-2", "seed=range(3)", "max_steps=10", "hydra/launcher=slurm",
            "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    out = subprocess.run([sys.executable, "-c", DRIVER, *argv], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("EVENTS ")), None)
    assert line is not None, out.stdout + out.stderr
    assert "dry run: nothing submitted" in out.stdout, out.stdout + out.stderr
    events = json.loads(line[len("EVENTS "):])
    queries = sorted(name for name, _ in events if name in ("array_limits", "partitions", "max_submit_jobs"))
    assert queries == ["array_limits", "max_submit_jobs", "partitions"], events  # each once
    assert not any(main for name, main in events if name in queries), events  # in the background
    names = [name for name, _ in events]
    asked = names[:names.index("plan_runs")]
    assert {"ask limits", "ask partitions", "ask cap"} <= set(asked), events  # before the plan, not after it


def test_ahead_hands_each_answer_once_and_raises_where_it_raised():
    calls = []
    ahead = Ahead()
    ahead.ask("a", lambda: calls.append("a") or 1)
    ahead.ask("a", lambda: calls.append("again") or 2)  # asked already: left as it is
    assert ahead.take("a", lambda: calls.append("now") or 3) == 1
    assert ahead.take("a", lambda: calls.append("now") or 3) == 3  # taken already: asked now
    assert calls == ["a", "now"]

    def fails():
        raise ValueError("no answer")

    ahead.ask("b", fails)
    try:
        ahead.take("b", lambda: 0)
    except ValueError as exc:
        assert str(exc) == "no answer"
    else:
        raise AssertionError("the question's exception was not raised")
