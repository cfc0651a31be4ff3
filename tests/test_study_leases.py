"""The search study's claims and leases, with simulated workers: an injected clock, queue and process
answers, no real sleeping and no Slurm. The journal and the lease files are real (in a temp dir)."""

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from optuna.trial import TrialState

from hpctrain.core.liveness import Liveness
from hpctrain.search import claims, journal, leases
from hpctrain.search import study as studies
from hpctrain.search.settings import Settings
from hpctrain.search.space import parse
from hpctrain.search.units import Next


def make_settings(n_trials: int = 3, **kw) -> Settings:
    space, problems = parse(["lr=interval(0.1,1)"])
    assert problems == []
    return Settings(space=space, n_trials=n_trials, n_workers=3, sampler="random", seed=0,
                            grace_s=60, heartbeat_s=10.0, max_adoptions=2, **kw)


class World:
    """What the simulated workers share: the clock, the queue, the local processes."""

    def __init__(self) -> None:
        self.now = time.time()
        self.queue_up = True
        self.queued: Set[str] = set()
        self.processes: Set[int] = set()

    def clock(self) -> float:
        return self.now

    def queue(self, job_ids: List[str]) -> Optional[Set[str]]:
        return {j for j in job_ids if j in self.queued} if self.queue_up else None

    def process(self, pid: int, started_by: float) -> Liveness:
        return Liveness.ALIVE if pid in self.processes else Liveness.GONE


class SimWorker:
    def __init__(self, world: World, sweep: Path, s: Settings, name: str, slurm: bool, pid: int) -> None:
        self.name, self.slurm, self.pid = name, slurm, pid
        self.alive = True
        self.held: Optional[leases.Assignment] = None
        self.seen: Optional[Dict[int, leases.Seen]] = None
        self.study = studies.open_study(sweep, s)
        fields = {"slurm_job_id": name if slurm else None, "pid": pid}
        self.leases = leases.Leases(sweep, s, name, fields, clock=world.clock, queue=world.queue,
                                     process=world.process)
        (world.queued if slurm else world.processes).add(name if slurm else pid)


class LeaseMachine(RuleBasedStateMachine):
    """Workers claim, beat, stall (the clock runs on without their beats), commit, die, get requeued and
    are replaced; the queue fails at any look; facts are looked up in one step and acted on in a later
    one (the slow call outside the lock)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="leases-"))
        self.world = World()
        self.settings = make_settings()
        self.workers: List[SimWorker] = []
        self.committed: Dict[int, List[str]] = {}
        self.serial = 0

    def _new_worker(self, slurm: bool) -> SimWorker:
        self.serial += 1
        w = SimWorker(self.world, self.dir, self.settings, f"{100 + self.serial}_0", slurm, 10_000 + self.serial)
        self.workers.append(w)
        return w

    @initialize()
    def start(self) -> None:
        for slurm in (True, True, False):
            self._new_worker(slurm)

    def _live(self) -> List[SimWorker]:
        return [w for w in self.workers if w.alive]

    def _look(self, w: SimWorker, queue_answers: bool) -> None:
        self.world.queue_up = queue_answers
        w.seen = w.leases.look(w.study)

    def _decide(self, w: SimWorker) -> None:
        with claims.trials_lock(self.dir):
            got = w.leases.decide(w.study, w.seen)
        w.seen = None
        if isinstance(got, leases.Assignment):
            w.leases._fill_params(w.study, got)
            w.held = got

    @rule(data=st.data(), queue_answers=st.booleans())
    def claim(self, data, queue_answers: bool) -> None:
        """Look and decide at once (a quick squeue)."""
        idle = [w for w in self._live() if w.held is None]
        if idle:
            w = data.draw(st.sampled_from(idle))
            self._look(w, queue_answers)
            self._decide(w)

    @rule(data=st.data(), queue_answers=st.booleans())
    def look(self, data, queue_answers: bool) -> None:
        """The facts only: the decision comes in a later step (a slow squeue, others acting meanwhile)."""
        idle = [w for w in self._live() if w.held is None]
        if idle:
            self._look(data.draw(st.sampled_from(idle)), queue_answers)

    @rule(data=st.data())
    def decide(self, data) -> None:
        ready = [w for w in self._live() if w.held is None and w.seen is not None]
        if ready:
            self._decide(data.draw(st.sampled_from(ready)))

    @rule(data=st.data())
    def beat(self, data) -> None:
        holders = [w for w in self._live() if w.held is not None]
        if holders:
            w = data.draw(st.sampled_from(holders))
            w.leases.beat(w.held)

    @rule(dt=st.sampled_from([1.0, 40.0, 61.0, 200.0]))
    def tick(self, dt: float) -> None:
        self.world.now += dt

    @rule(data=st.data())
    def commit(self, data) -> None:
        holders = [w for w in self._live() if w.held is not None]
        if not holders:
            return
        w = data.draw(st.sampled_from(holders))
        a, w.held = w.held, None
        if w.leases.commit(w.study, a, TrialState.COMPLETE, 0.5):
            self.committed.setdefault(a.number, []).append(w.name)

    @rule(data=st.data())
    def die(self, data) -> None:
        """SIGKILL, a node lost: the job leaves the queue, the process is gone, no goodbye."""
        live = self._live()
        if live:
            w = data.draw(st.sampled_from(live))
            w.alive, w.held, w.seen = False, None, None
            self.world.queued.discard(w.name)
            self.world.processes.discard(w.pid)

    @rule(data=st.data())
    def requeue(self, data) -> None:
        """Preempted and requeued: the same job id, a fresh process that remembers nothing."""
        live = [w for w in self._live() if w.slurm]
        if live:
            w = data.draw(st.sampled_from(live))
            w.held, w.seen = None, None
            w.leases = leases.Leases(self.dir, self.settings, w.name, dict(w.leases.fields), clock=self.world.clock,
                                      queue=self.world.queue, process=self.world.process)

    @rule(data=st.data())
    def time_limit(self, data) -> None:
        """Out of requeues at a time limit: the trial is let go (resumable), the worker ends."""
        holders = [w for w in self._live() if w.held is not None]
        if holders:
            w = data.draw(st.sampled_from(holders))
            assert w.leases.release(w.held)
            w.alive, w.held = False, None
            self.world.queued.discard(w.name)
            self.world.processes.discard(w.pid)

    @precondition(lambda self: len(self._live()) < 3)
    @rule(slurm=st.booleans())
    def replace(self, slurm: bool) -> None:
        self._new_worker(slurm)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def no_trial_held_by_two_live_workers(self) -> None:
        held = [w.held.number for w in self._live() if w.held is not None]
        assert len(held) == len(set(held)), held

    @invariant()
    def every_live_holder_still_holds_its_lease(self) -> None:
        for w in self._live():
            if w.held is not None:
                assert w.leases.holds(w.held), (w.name, w.held, claims.read_lease(self.dir, w.held.number))

    @invariant()
    def never_past_n_trials(self) -> None:
        if self.workers:
            assert len(self.workers[0].study.get_trials(deepcopy=False)) <= studies.budget(self.settings)

    @invariant()
    def one_commit_per_trial(self) -> None:
        assert all(len(names) == 1 for names in self.committed.values()), self.committed

    def teardown(self) -> None:
        try:
            if self.workers:
                self._nothing_lost()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _nothing_lost(self) -> None:
        """Every worker dies; a new one, with the queue answering, finishes the study at exactly n_trials."""
        for w in self._live():
            w.alive = False
            self.world.queued.discard(w.name)
            self.world.processes.discard(w.pid)
        self.world.queue_up = True
        self.world.now += 1000
        last = self._new_worker(True)
        for _ in range(20):
            got = last.leases.next_trial(last.study)
            if got is Next.DONE:
                break
            assert isinstance(got, leases.Assignment), got
            assert last.leases.commit(last.study, got, TrialState.COMPLETE, 0.5)
        found = last.study.get_trials(deepcopy=False)
        assert len(found) == studies.budget(self.settings)
        assert all(t.state.is_finished() for t in found), [(t.number, t.state) for t in found]


LeaseMachine.TestCase.settings = settings(max_examples=int(os.environ.get("LEASE_EXAMPLES", "40")),
                                          stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_leases_state_machine = LeaseMachine.TestCase


# ---------------------------------------------------------------- single scenarios
@pytest.fixture
def world() -> World:
    return World()


def _worker(world: World, sweep: Path, s: Settings, name: str, slurm: bool = True) -> SimWorker:
    return SimWorker(world, sweep, s, name, slurm, hash(name) % 100_000 + 2)


def test_a_failed_queue_answer_keeps_the_trial_and_counts_no_adoption(tmp_path, world):
    s = make_settings(n_trials=1)
    a, b = _worker(world, tmp_path, s, "7_0"), _worker(world, tmp_path, s, "7_1")
    held = a.leases.next_trial(a.study)
    assert isinstance(held, leases.Assignment) and held.how == "new"
    world.queued.discard("7_0")  # a's job is gone, but the queue cannot say so
    world.queue_up = False
    world.now += 10 * s.grace_s  # its heartbeat long stale
    for _ in range(3):
        assert b.leases.next_trial(b.study) is Next.WAIT  # unknown: look again later, never adopt
    assert claims.read_lease(tmp_path, held.number).owner == "7_0"
    world.queue_up = True
    got = b.leases.next_trial(b.study)
    assert isinstance(got, leases.Assignment) and got.how == "adopted" and got.adoptions == 1
    assert not a.leases.holds(held) and not a.leases.commit(a.study, held, TrialState.COMPLETE, 1.0)
    assert b.leases.commit(b.study, got, TrialState.COMPLETE, 2.0)
    assert [t.value for t in b.study.get_trials()] == [2.0]


def test_a_requeued_worker_in_the_queue_keeps_its_stalled_trial(tmp_path, world):
    s = make_settings(n_trials=1)
    a, b = _worker(world, tmp_path, s, "8_0"), _worker(world, tmp_path, s, "8_1")
    held = a.leases.next_trial(a.study)
    world.now += 10 * s.grace_s  # no beat (requeued, pending), its job still queued
    assert b.leases.next_trial(b.study) is Next.DONE
    again = leases.Leases(tmp_path, s, "8_0", a.leases.fields, clock=world.clock, queue=world.queue,
                           process=world.process).next_trial(a.study)
    assert isinstance(again, leases.Assignment) and (again.how, again.number) == ("resumed", held.number)
    assert again.gen == held.gen + 1 and not a.leases.holds(held)  # the old incarnation is fenced off


def test_the_last_free_worker_asks_about_a_fresh_heartbeat_before_it_leaves(tmp_path, world):
    """A killed job's heartbeat stays fresh for a few seconds: a worker that would end the study asks the
    queue about such an owner, and takes its trial when the job is gone (a worker whose job is queued
    keeps it)."""
    s = make_settings(n_trials=1)
    a, b, c = (_worker(world, tmp_path, s, f"12_{i}") for i in range(3))
    held = a.leases.next_trial(a.study)
    a.leases.beat(held)
    assert b.leases.next_trial(b.study) is Next.DONE  # a beats and is queued: it finishes its trial
    world.queued.discard("12_0")  # SIGKILLed a second ago: its heartbeat is still fresh
    got = c.leases.next_trial(c.study)
    assert isinstance(got, leases.Assignment) and (got.how, got.number) == ("adopted", held.number)
    assert not a.leases.holds(held)


def test_a_released_trial_is_resumed_at_once_and_not_failed(tmp_path, world):
    s = make_settings(n_trials=1)
    a, b = _worker(world, tmp_path, s, "9_0"), _worker(world, tmp_path, s, "9_1")
    held = a.leases.next_trial(a.study)
    assert a.leases.release(held)
    (t,) = a.study.get_trials()
    assert t.state == TrialState.RUNNING  # resumable, not FAIL
    got = b.leases.next_trial(b.study)  # its heartbeat is fresh: the release alone lets it go
    assert isinstance(got, leases.Assignment) and got.how == "adopted" and got.adoptions == 0
    assert got.params == held.params


def test_a_dead_local_process_loses_its_trial_a_live_one_keeps_it(tmp_path, world):
    s = make_settings(n_trials=1)
    a = _worker(world, tmp_path, s, "local-a", slurm=False)
    b = _worker(world, tmp_path, s, "local-b", slurm=False)
    held = a.leases.next_trial(a.study)
    world.now += 10 * s.grace_s
    assert b.leases.next_trial(b.study) is Next.DONE  # alive, however stale its heartbeat
    world.processes.discard(a.pid)
    got = b.leases.next_trial(b.study)
    assert isinstance(got, leases.Assignment) and got.number == held.number and got.adoptions == 1


def test_two_claims_of_one_generation_one_wins(tmp_path):
    won = [claims.claim(tmp_path, 0, 1, owner, time.time()) for owner in ("a", "b")]
    assert won[0] is not None and won[1] is None
    assert claims.read_lease(tmp_path, 0).owner == "a"


def test_too_many_deaths_fail_the_trial(tmp_path, world):
    s = make_settings(n_trials=1)
    names = [f"5_{i}" for i in range(s.max_adoptions + 2)]
    first = _worker(world, tmp_path, s, names[0])
    first.leases.next_trial(first.study)
    for name in names[1:]:
        world.queued.clear()
        world.now += 1000
        w = _worker(world, tmp_path, s, name)
        got = w.leases.next_trial(w.study)
    assert got is Next.DONE
    (t,) = w.study.get_trials()
    assert t.state == TrialState.FAIL


# ---------------------------------------------------------------- the journal
def _journal(tmp_path: Path) -> str:
    s = make_settings(n_trials=2)
    study = studies.open_study(tmp_path, s)
    for value in (1.0, 2.0):
        trial = study.ask()
        trial.suggest_float("lr", 0.1, 1)
        study.tell(trial, value)
    return studies.journal_path(tmp_path)


def test_a_torn_tail_is_set_aside_before_the_next_append(tmp_path):
    path = _journal(tmp_path)
    data = Path(path).read_bytes()
    last = data[:-1].rfind(b"\n") + 1
    Path(path).write_bytes(data[: last + (len(data) - last) // 2])  # the last line cut in half
    said: List[str] = []
    store = studies.storage(tmp_path, say=said.append)  # opening repairs it
    assert len(said) == 1 and journal.side_file(path) in said[0]
    assert Path(journal.side_file(path)).read_bytes() == data[last: last + (len(data) - last) // 2] + b"\n"
    Path(path).write_bytes(Path(path).read_bytes() + b'{"op_code":5,"wor')  # torn again, while open
    import optuna

    study = optuna.load_study(study_name=studies.STUDY_NAME, storage=store)
    trial = study.ask()  # the append sets the new fragment aside first
    study.tell(trial, 3.0)
    assert len(said) == 2
    fresh = optuna.load_study(study_name=studies.STUDY_NAME, storage=studies.storage(tmp_path, say=said.append))
    # the torn line was trial 1's tell: it is running again (for a worker to adopt), the rest is whole
    assert [t.state.name for t in fresh.get_trials()] == ["COMPLETE", "RUNNING", "COMPLETE"]
    assert len(said) == 2


def test_a_log_glued_onto_a_fragment_is_kept(tmp_path):
    path = _journal(tmp_path)
    lines = Path(path).read_bytes().splitlines(keepends=True)
    glued = lines[:-1]
    glued.insert(-1, b'{"op_code":5,"worker_id":"x"' + glued.pop(-1))  # an old writer appended onto a torn line
    Path(path).write_bytes(b"".join(glued + [lines[-1]]))
    said: List[str] = []
    import optuna

    study = optuna.load_study(study_name=studies.STUDY_NAME, storage=studies.storage(tmp_path, say=said.append))
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"] and len(said) == 1
    assert Path(journal.side_file(path)).read_bytes() == b'{"op_code":5,"worker_id":"x"\n'


def test_a_lost_newline_alone_keeps_the_log(tmp_path):
    path = _journal(tmp_path)
    Path(path).write_bytes(Path(path).read_bytes()[:-1])
    said: List[str] = []
    import optuna

    study = optuna.load_study(study_name=studies.STUDY_NAME, storage=studies.storage(tmp_path, say=said.append))
    assert [t.value for t in study.get_trials()] == [1.0, 2.0] and said == []
    assert not os.path.exists(journal.side_file(path))


def test_time_left_from_slurms_end_time(monkeypatch):
    from hpctrain.search.worker import _time_left

    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    assert _time_left() is None
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 100))
    assert 90 < _time_left() <= 100


def test_leases_read_through_a_workers_claims_cache_are_the_newest_generation(tmp_path, world):
    """A worker keeps the claim files it read (a claim is never written again): a newer generation, another
    worker's, is still seen at once, and an unreadable claim is read again next time, not kept."""
    s = make_settings(n_trials=1)
    a, b = _worker(world, tmp_path, s, "5_0"), _worker(world, tmp_path, s, "5_1")
    held = a.leases.next_trial(a.study)
    assert a.leases.holds(held) and a.leases.claims  # read once: kept
    assert claims.claim(tmp_path, held.number, held.gen + 1, "5_1", world.now, mark=claims.Mark.RELEASED) is not None
    assert not a.leases.holds(held)  # the cached generation is not the newest any more
    assert claims.read_leases(tmp_path, a.leases.claims) == claims.read_leases(tmp_path)
    torn = Path(claims.claim_path(tmp_path, held.number, held.gen + 2))
    torn.write_text("")  # as a claim seen before its content (a reader on another host)
    assert getattr(claims.read_leases(tmp_path, b.leases.claims).get(held.number), "gen", None) != held.gen + 2
    torn.write_text('{"owner": "5_0", "number": 0}')
    got = claims.read_leases(tmp_path, b.leases.claims)[held.number]
    assert got.gen == held.gen + 2 and got.owner == "5_0"
