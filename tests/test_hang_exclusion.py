"""A hung run's retry keeps off the node(s) it hung on only while its partition can spare them, and one node's
watchdog names the rank that waits in its own code, not the one waiting in the collective (issue 30)."""

from hpctrain.job.hangcall import RankReport, named
from hpctrain.slurm import exclusion
from hpctrain.slurm.exclusion import plan, usable


def test_node_states_that_can_run_a_job():
    assert all(usable(s) for s in ("idle", "allocated", "mixed", "completing", "idle~", "mixed-", "planned"))
    assert not any(usable(s) for s in ("down*", "idle*", "drained", "draining", "down", "fail", "reserved",
                                       "maint", "idle$", "inval", ""))


def test_a_hung_node_is_excluded_while_the_partition_keeps_enough_usable_nodes():
    two = {"n1": "idle", "n2": "allocated"}
    assert plan(["n1"], [], "debug", two, 1) == exclusion.Exclusion(["n1"], ["n1"])
    kept = plan(["n2"], [], "debug", two, 2)
    assert kept.exclude == [] and kept.avoided == [] and kept.kept == ["n2"]
    assert kept.note == "not avoiding n2: partition debug has 2 usable nodes, the job needs 2"
    # a drained node does not count; excluding a node that is not usable anyway costs nothing
    three = {"n1": "mixed", "n2": "idle", "n3": "drained"}
    assert plan(["n1"], [], "p", three, 2).note == "not avoiding n1: partition p has 2 usable nodes, the job needs 2"
    assert plan(["n3", "n1"], [], "p", three, 1) == exclusion.Exclusion(["n3", "n1"], ["n3", "n1"])
    # exclusions from before stay and count; of two hung nodes only what leaves enough
    four = {f"n{i}": "idle" for i in range(1, 5)}
    out = plan(["n1", "n2"], ["n4"], "p", four, 2)
    assert out.exclude == ["n4", "n1"] and out.kept == ["n2"]
    assert out.note == "not avoiding n2: partition p has 4 usable nodes (1 excluded already), the job needs 2"
    assert plan(["n4"], ["n4"], "p", four, 4) == exclusion.Exclusion(["n4"], [])  # nothing new to exclude


def test_unknown_usable_nodes_exclude_nothing():
    out = plan(["n2"], ["n9"], "debug", None, 1, "the usable nodes of partition debug are unknown (sinfo: timed out)")
    assert out.exclude == ["n9"] and out.avoided == [] and out.kept == ["n2"]
    assert out.note == "not avoiding n2: the usable nodes of partition debug are unknown (sinfo: timed out)"


def test_a_host_side_that_does_not_answer_excludes_nothing_and_says_why(tmp_path, monkeypatch):
    """The job's host dir without its helper (gone): nothing excluded, one line naming the reason."""
    monkeypatch.setenv("HPCTRAIN_HOST_DIR", str(tmp_path))
    out = exclusion.decide(["n2"])
    assert out.exclude == [] and out.avoided == [] and out.kept == ["n2"]
    assert out.note.startswith("not avoiding n2: the job's partition and node count are unknown (the host-side "
                               "helper is gone"), out.note


def rank(r: int, node: str, own: bool, stalled: bool = True) -> RankReport:
    return RankReport(r, node, 30, "train", stalled, own, "block_forever (user_models.py:272)" if own else
                      "wait (distributed_c10d.py:1)", 6.0, 5.0)


def test_the_rank_waiting_in_its_own_code_is_named_not_its_peer_waiting_in_the_collective():
    assert named([rank(0, "n1", False), rank(1, "n2", True)]) == ([rank(1, "n2", True)], False)
    # every rank in torch (a deadlock, a dead link): all the stalled ones, as the fallout of something unseen
    every = [rank(1, "n2", False), rank(0, "n1", False), rank(2, "n3", False, stalled=False)]
    assert named(every) == ([every[1], every[0]], True)


def test_status_says_why_a_retry_pending_in_the_queue_was_not_kept_off_its_node(tmp_path):
    """The retrying run's row note (status prints it under the table): the exclusion's one line, then Slurm's
    reason."""
    from hpctrain.core import events
    from hpctrain.review.runs import Accounting, _Judge
    from hpctrain.review.sweep import ListedRun, SweepListing
    from hpctrain.core.state import State

    run_dir = tmp_path / "run"
    events.submitted(run_dir)
    events.started(run_dir)
    events.hung(run_dir, "hung at step 30 (train): ...", rank=1, nodes=["n2"])
    note = "not avoiding n2: partition debug has 2 usable nodes, the job needs 2"
    events.retrying(run_dir, 1, 1, not_avoided=["n2"], note=note)
    sweep = SweepListing(tmp_path, "slurm", tmp_path / ".submitit", [ListedRun(0, "run", run_dir, [], "7")])
    judge = _Judge(sweep, {"7": ("PENDING", "BeginTime")}, Accounting(["7"]))
    assert judge.state(sweep.runs[0], events.read(run_dir), {}) == (State.RETRYING, f"{note}; BeginTime")
