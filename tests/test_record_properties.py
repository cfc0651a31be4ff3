"""The record fold over any interleaving of its writers, with each host's clock off by up to five minutes.

Writers: the launcher (login node), each rank of each attempt (compute nodes, one host per rank), the batch
script after ``srun``, ``hpctrain cancel`` (login node). Events are written through the real writer
(:func:`hpctrain.core.events._write`, tags and all), each host's clock shifted; the fold must give the same
answer whatever the shifts, keep a final state final within its attempt, and count the retry budget once.
"""

import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.core import events
from hpctrain.core.state import Event, State, fold

pytestmark = pytest.mark.login

Step = Tuple[str, str, int, str]  # (host, kind, rank, key): key is the Slurm job/restart of the attempt


def _write_all(run: Path, steps: List[Step], offsets: Dict[str, int]) -> None:
    """Write the steps in order (the order they really happened), each with its host's clock."""
    events._own_attempt.clear()
    base = 1_700_000_000 * 10**9
    for i, (host, kind, rank, key) in enumerate(steps):
        now = base + i * 10**9 + offsets.get(host, 0) * 10**9
        env = {"SLURM_JOB_ID": key.split("r")[0], "SLURM_RESTART_COUNT": key.split("r")[1]} if key else {}
        with mock.patch.object(time, "time_ns", return_value=now), mock.patch.dict(os.environ, env, clear=False):
            if not key:
                for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_RESTART_COUNT"):
                    os.environ.pop(var, None)
            if rank > 0 or host == "batch":  # another process: it does not know the attempt rank 0 started
                events._own_attempt.clear()
            fn = {"submitted": lambda: events.submitted(run), "started": lambda key=key: events.started(run, job_id=key),
                  "failed": lambda rank=rank: events.failed(run, f"ValueError: rank {rank}", rank=rank),
                  "retrying": lambda: events.retrying(run, 1, 2), "requeued": lambda: events.requeued(run),
                  "completed": lambda: events.completed(run), "cancelled": lambda: events.cancelled(run),
                  "timeout": lambda: events.timed_out(run, "timed-out too many times")}[kind]
            fn()


def _fold(run: Path):
    rs = events.read(run)
    return rs.state, rs.retries, rs.requeues, rs.restarts, rs.error


@st.composite
def scenarios(draw) -> Tuple[List[Step], Optional[str], List[Step]]:
    """A submission, up to three attempts (each: rank 0 starts; then ranks fail, complete, get requeued
    or a retry is decided), the steps of each attempt interleaved across ranks, and a cancel anywhere."""
    steps: List[Step] = [("login", "submitted", -1, "")]
    n_ranks = draw(st.integers(1, 3))
    final_kind: Optional[str] = None
    for attempt in range(draw(st.integers(1, 3))):
        key = f"77r{attempt}"
        steps.append(("node0", "started", 0, key))
        ending = draw(st.sampled_from(["completed", "failed", "requeued", "timeout", "none"]))
        per_rank: List[List[Step]] = []
        for rank in range(n_ranks):
            mine: List[Step] = []
            if ending == "failed" and draw(st.booleans()):
                mine.append((f"node{rank}", "failed", rank, key))
            per_rank.append(mine)
        if ending == "completed":
            per_rank[0].append(("node0", "completed", 0, key))
        if ending == "requeued":
            per_rank[0].append(("node0", "requeued", 0, key))
            if draw(st.booleans()):  # USR2 during the final save: the requeue comes before the completion
                per_rank[0].append(("node0", "completed", 0, key))
        if ending == "timeout":
            per_rank[0] += [("node0", "requeued", 0, key), ("node0", "timeout", 0, key)]
        shuffled = draw(st.permutations([s for r in per_rank for s in r]))
        own = {r: iter(per_rank[r]) for r in range(n_ranks)}  # any interleaving that keeps each rank's order
        merged = [next(own[s[2]]) for s in shuffled]
        steps += merged
        if ending == "failed":
            steps.append(("batch", "failed", -1, key))
            steps.append(("batch", "retrying", -1, key))
            if draw(st.booleans()):  # the decider's event twice (a second look): counted once
                steps.append(("batch", "retrying", -1, key))
        if ending in ("completed", "timeout") or (ending == "requeued" and steps[-1][1] == "completed"):
            final_kind = steps[-1][1] if steps[-1][1] in ("completed", "timeout") else "completed"
            break
    cancel_at = draw(st.none() | st.integers(1, len(steps)))
    if cancel_at is not None:
        steps.insert(cancel_at, ("login", "cancelled", -1, ""))
    return steps, final_kind, []


offsets = st.dictionaries(st.sampled_from(["login", "node0", "node1", "node2", "batch"]), st.integers(-300, 300))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios(), shift=offsets)
def test_the_fold_does_not_depend_on_clocks_and_final_states_stay_final(tmp_path_factory, scenario, shift):
    steps, final_kind, _ = scenario
    straight = tmp_path_factory.mktemp("straight")
    skewed = tmp_path_factory.mktemp("skewed")
    _write_all(straight, steps, {})
    _write_all(skewed, steps, shift)
    assert _fold(skewed) == _fold(straight)  # a host's clock shifted changes nothing
    rs = events.read(skewed)
    kinds = [s[1] for s in steps]
    if "cancelled" in kinds and "completed" not in kinds:
        assert rs.state is State.CANCELLED  # a cancel is never lost to a requeue, whatever came first
    elif "completed" in kinds:
        assert rs.state is State.COMPLETED  # a completion is never erased by a later requeue
    elif final_kind == "timeout":
        assert rs.state is State.TIMEOUT
    attempts_retried = len({s[3] for s in steps if s[1] == "retrying"})
    assert rs.retries == attempts_retried  # the budget counts attempts, not events
    assert rs.restarts == max(0, sum(k == "started" for k in kinds) - 1)


@given(shift=offsets, n=st.integers(1, 4))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_new_start_after_a_failure_is_a_new_attempt_whatever_the_clocks(tmp_path_factory, shift, n):
    run = tmp_path_factory.mktemp("rerun")
    steps: List[Step] = []
    for i in range(n):  # python -m hpctrain again and again in one dir: started, failed, started, ...
        steps += [("node0" if i % 2 else "login", "started", 0, ""), ("node0" if i % 2 else "login", "failed", 0, "")]
    steps.append(("node1", "started", 0, ""))
    _write_all(run, steps, shift)
    rs = events.read(run)
    assert rs.state is State.RUNNING and rs.restarts == n


def test_untagged_records_fold_as_before(tmp_path):
    """Records written before the tags: placed by time, ``retrying`` and ``requeued`` end an attempt."""
    names = ["00000000000000000001.submitted.-1.a.json", "00000000000000000002.started.0.b.json",
             "00000000000000000003.completed.0.c.json", "00000000000000000004.requeued.0.d.json"]
    evs = [events.parse_name(n, str(tmp_path)) for n in names]
    assert fold(evs).state is State.COMPLETED  # a requeue after the completion does not erase it
    evs = [Event(1, "submitted", -1, "a"), Event(2, "started", 0, "b"), Event(3, "requeued", 0, "c"),
           Event(4, "started", 0, "d")]
    rs = fold(evs)
    assert rs.state is State.RUNNING and rs.restarts == 1 and rs.requeues == 1
