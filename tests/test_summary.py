"""metrics.json through its one writer: the merge rule, and two processes writing at once."""

import json
import multiprocessing
import time

import pytest

from hpctrain.core import events, summary
from hpctrain.core.state import RunState, State

pytestmark = pytest.mark.login

N = 300  # writes per process


def test_merge_keeps_the_step_the_metrics_and_a_final_status():
    none = RunState(None)
    old = {"status": "completed", "step": 10, "metrics": {"train/loss": 1.0, "val/loss": 2.0}}
    new = summary.merge(old, {"step": 7, "metrics": {"train/loss": 0.5}, "status": "running", "host": "h"}, none, 1.0)
    assert new["step"] == 10  # a late writer of an older step
    assert new["metrics"] == {"train/loss": 0.5, "val/loss": 2.0}  # key by key
    assert new["status"] == "completed" and new["host"] == "h" and new["updated"] == 1.0
    assert summary.merge({"status": "running"}, {"status": "failed"}, none, 2.0)["status"] == "failed"


def test_a_new_attempt_may_go_back_to_its_checkpoint(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path)
    summary.write(tmp_path, step=50)
    assert summary.write(tmp_path, step=40)["step"] == 50
    events.requeued(tmp_path)
    events.started(tmp_path)  # resumed from the checkpoint at step 30
    assert summary.write(tmp_path, step=30)["step"] == 30


def _progress(run_dir: str, go: "multiprocessing.synchronize.Event") -> None:
    """Rank 0's progress writes: step after step."""
    go.wait()
    for step in range(1, N + 1):
        summary.write(run_dir, step=step, metrics={"train/loss": 1.0 / step})


def _cancel(run_dir: str, go: "multiprocessing.synchronize.Event") -> None:
    """``hpctrain cancel``: the event, then the summary, again and again (as several cancels would)."""
    go.wait()
    time.sleep(0.05)
    events.cancelled(run_dir)
    for _ in range(N):
        summary.write(run_dir)


def test_a_cancel_racing_progress_loses_neither_the_step_nor_the_state(tmp_path):
    events.submitted(tmp_path)
    events.started(tmp_path)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_progress, args=(str(tmp_path), go)),
             ctx.Process(target=_cancel, args=(str(tmp_path), go))]
    for p in procs:
        p.start()
    go.set()
    seen, last_step, cancelled = [], 0, False
    while any(p.is_alive() for p in procs):  # what a reader (status) sees meanwhile
        try:
            now = json.loads((tmp_path / "metrics.json").read_text())
        except (OSError, ValueError):
            continue  # not written yet (a part is never seen: the writes are atomic)
        step, status = now.get("step", 0), now["status"]
        assert step >= last_step, f"the step went back from {last_step} to {step}"
        assert not (cancelled and status != State.CANCELLED), f"cancelled, then {status}"
        last_step, cancelled = step, cancelled or status == State.CANCELLED
        seen.append(status)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    final = summary.read(tmp_path)
    assert final["status"] == "cancelled" and final["step"] == N and final["metrics"] == {"train/loss": 1.0 / N}
    assert events.read(tmp_path).state is State.CANCELLED
