"""Promotion ASHA and Hyperband: the pure decisions (simulated, with hypothesis), then the claims of units
through the study's real leases (a journal and claim files in a temp dir, simulated workers)."""

import random
import time
from typing import Dict, List

from hypothesis import given, settings, strategies as st

from hpctrain.core.state import Direction, State
from hpctrain.search import claims, leases
from hpctrain.search import study as studies
from hpctrain.search.asha import Asha, hyperband, rungs
from hpctrain.search.settings import Settings
from hpctrain.search.space import parse
from hpctrain.search.units import Next, StudyView, TrialView, Unit, UnitKind


def test_rungs_are_min_steps_times_powers_of_eta_then_max_steps():
    assert rungs(10, 3, 90) == [10, 30, 90]
    assert rungs(10, 3, 100) == [10, 30, 90, 100]
    assert rungs(10, 2, 30) == [10, 20, 30]
    hb = hyperband(10, 3, 90)
    assert hb.ladders == [[10, 30, 90], [30, 90], [90]]
    assert sorted(set(hb.cycle)) == [0, 1, 2] and hb.cycle.count(0) > hb.cycle.count(1) > hb.cycle.count(2)


def simulate(sched: Asha, n_trials: int, workers: int, seed: int, direction: Direction = Direction.MIN,
             fail_p: float = 0.0) -> Dict[str, object]:
    """Workers pull units; units end in random order; each trial's objective falls with steps."""
    rng = random.Random(seed)
    view = StudyView([], n_trials, sched.max_steps, direction)
    quality: Dict[int, float] = {}
    running: List[Unit] = []
    promotions: List[tuple] = []
    decisions = 0
    while True:
        decisions += 1
        assert decisions < 10_000
        while len(running) < workers:
            u = sched.next_unit(view)
            if isinstance(u, Next):
                break
            if u.kind is UnitKind.NEW:
                assert len(view.trials) < n_trials  # never more trials than the budget
                u = u.numbered(len(view.trials))
                quality[u.trial] = rng.random()
                view.trials.append(TrialView(u.trial, State.RUNNING, {"q": quality[u.trial]}, {}, u))
            else:
                t = view.by_number()[u.trial]
                assert t.state is State.PAUSED and u.start_step == t.paused_at and u.index == t.unit.index + 1
                ladder = sched.ladders[u.bracket]
                members = [x for x in view.trials if x.unit.bracket == u.bracket and ladder[u.index - 1] in x.values]
                ranked = sorted(members, key=lambda x: direction.sign * x.values[ladder[u.index - 1]])
                assert t in ranked[: len(members) // sched.eta]  # in the top 1/eta of its rung when promoted
                promotions.append((u.trial, u.index - 1))
                t.state, t.unit = State.RUNNING, u
            running.append(u)
        if not running:
            assert sched.next_unit(view) is Next.DONE
            break
        u = running.pop(rng.randrange(len(running)))
        t = view.by_number()[u.trial]
        if rng.random() < fail_p:
            t.state = State.FAILED
            continue
        value = quality[u.trial] / (1 + u.end_step) * (1 if direction is Direction.MIN else -1)
        t.values[u.end_step] = value
        t.state = State.PAUSED if u.end_step < sched.max_steps else State.COMPLETED
    stranded = sched.stranded(view)
    assert stranded == [t.number for t in view.trials if t.state is State.PAUSED]
    return {"view": view, "promotions": promotions}


@settings(max_examples=60, deadline=None)
@given(n_trials=st.integers(1, 30), workers=st.integers(1, 6), eta=st.integers(2, 4), seed=st.integers(0, 10**6),
       fail=st.sampled_from([0.0, 0.2]), bands=st.booleans(), maximize=st.booleans())
def test_no_trial_is_promoted_twice_and_the_budget_is_never_exceeded(n_trials, workers, eta, seed, fail, bands,
                                                                     maximize):
    sched = hyperband(5, eta, 5 * eta ** 2) if bands else Asha(5, eta, 5 * eta ** 2)
    out = simulate(sched, n_trials, workers, seed, Direction.MAX if maximize else Direction.MIN, fail)
    promotions = out["promotions"]
    assert len(promotions) == len(set(promotions))  # a (trial, rung) leaves its rung once
    view = out["view"]
    assert len(view.trials) == n_trials
    for t in view.trials:  # every trial ends completed, failed or paused (to be ended pruned)
        assert t.state in (State.COMPLETED, State.FAILED, State.PAUSED)


def test_nine_trials_eta_three_one_worker_promote_three_then_one():
    out = simulate(Asha(10, 3, 90), 9, 1, seed=1)
    view = out["view"]
    reached = {step: sum(step in t.values for t in view.trials) for step in (10, 30, 90)}
    assert reached == {10: 9, 30: 3, 90: 1}
    assert len(out["promotions"]) == 4
    best = min(view.trials, key=lambda t: t.params["q"])
    assert 90 in best.values  # with a noiseless objective the best trial goes the whole way


def test_a_paused_trial_outside_the_top_waits_and_a_running_unit_keeps_workers_idle():
    sched = Asha(10, 3, 90)
    u = lambda n: Unit(n, UnitKind.NEW, 0, 10)
    paused = [TrialView(n, State.PAUSED, {}, {10: float(n)}, u(n)) for n in range(2)]
    view = StudyView(paused, n_trials=2, max_steps=90)
    assert sched.next_unit(view) is Next.DONE and sched.stranded(view) == [0, 1]  # 2 // 3 = 0: none promoted
    view.trials.append(TrialView(2, State.RUNNING, {}, {}, u(2)))
    view.n_trials = 3
    assert sched.next_unit(view) is Next.IDLE and sched.stranded(view) == []
    view.trials[2] = TrialView(2, State.PAUSED, {}, {10: 5.0}, u(2))
    got = sched.next_unit(view)
    assert got == Unit(0, UnitKind.PROMOTE, 10, 30, {}, None, 1, 0)  # the best of three
    table = {(r["rung"]): r for r in sched.table(view)}
    assert table[0]["trials"] == 3 and table[0]["best"] == 0.0 and table[1]["trials"] == 0


# ---------------------------------------------------------------- the claims, on real lease files
def make_settings(n_trials: int) -> Settings:
    space, problems = parse(["lr=interval(0.1,1)"])
    assert problems == []
    return Settings(space=space, n_trials=n_trials, n_workers=3, sampler="random", pruner="none", seed=0,
                            scheduler="asha", max_steps=90, eval_every=10, min_steps=10, eta=3)


def test_two_workers_promoting_one_paused_trial_one_wins_and_it_runs_once(tmp_path):
    s = make_settings(3)
    now = [time.time()]
    workers = [leases.Leases(tmp_path, s, f"10{i}_0", {"slurm_job_id": f"10{i}_0"}, clock=lambda: now[0],
                              queue=lambda ids: set(ids)) for i in range(2)]
    study = studies.open_study(tmp_path, s)
    for n in range(3):  # three new trials, each run to the first rung and paused
        a = workers[0].next_trial(study)
        assert isinstance(a, leases.Assignment) and a.unit == Unit(n, UnitKind.NEW, 0, 10)
        from hpctrain._compat.optuna import live_trial

        live_trial(study, a.trial_id).report(float(n), 10)
        assert workers[0].pause(a)
    assert workers[1].next_trial(study) is not None
    # the second worker got the promotion of trial 0 (best of three); the first, asking now, gets nothing to run
    lease = claims.read_lease(tmp_path, 0)
    assert lease.owner == "101_0" and lease.unit.kind.value == "promote" and lease.mark is not claims.Mark.PAUSED
    assert workers[0].next_trial(study) is Next.IDLE  # trial 0 runs: its result may bring more
    # a stale claimant of the same generation loses (the fence, lock or no lock)
    assert claims.claim(tmp_path, 0, lease.gen, "100_0", now[0]) is None


def test_the_study_ends_every_paused_trial_that_nothing_will_promote_as_pruned(tmp_path):
    s = make_settings(2)
    w = leases.Leases(tmp_path, s, "100_0", {"slurm_job_id": "100_0"}, queue=lambda ids: set(ids))
    study = studies.open_study(tmp_path, s)
    from hpctrain._compat.optuna import live_trial

    for n in range(2):
        a = w.next_trial(study)
        live_trial(study, a.trial_id).report(1.0 + n, 10)
        assert w.pause(a)
    assert w.next_trial(study) is Next.DONE
    assert sorted(n for n, _, _ in w.ended) == [0, 1] and {step for _, step, _ in w.ended} == {10}
    states = [t.state.name for t in studies.open_study(tmp_path, s).get_trials()]
    assert states == ["PRUNED", "PRUNED"]
    other = leases.Leases(tmp_path, s, "101_0", {"slurm_job_id": "101_0"}, queue=lambda ids: set(ids))
    assert other.next_trial(study) is Next.DONE and other.ended == []  # ended once


def test_an_ending_cut_short_between_its_claim_and_the_tell_is_finished_by_the_next_worker(tmp_path):
    s = make_settings(1)
    w = leases.Leases(tmp_path, s, "100_0", {"slurm_job_id": "100_0"}, queue=lambda ids: set(ids))
    study = studies.open_study(tmp_path, s)
    from hpctrain._compat.optuna import live_trial

    a = w.next_trial(study)
    live_trial(study, a.trial_id).report(1.0, 10)
    assert w.pause(a)
    lease = claims.read_lease(tmp_path, 0)
    # the ender claimed the ending, wrote nothing more and died
    claims.claim(tmp_path, 0, lease.gen + 1, "100_0", time.time(), unit=lease.unit, step=10, mark=claims.Mark.ENDED)
    assert study.get_trials()[0].state.name == "RUNNING"
    other = leases.Leases(tmp_path, s, "101_0", {"slurm_job_id": "101_0"}, queue=lambda ids: set(ids))
    assert other.next_trial(study) is Next.DONE
    assert other.ended == [(0, 10, dict(study.get_trials()[0].params))]  # its record written by this worker
    assert studies.open_study(tmp_path, s).get_trials()[0].state.name == "PRUNED"


def test_studies_of_neighbouring_seeds_share_no_workers_sampler_stream():
    """With ``seed + worker`` the studies of seeds 0 and 1 (4 workers) drew 3 of 4 workers' values alike: their
    results were not independent. Worker 0 keeps the study's seed (a one-worker study samples as before)."""
    import optuna

    space, _ = parse(["lr=tag(log,interval(1e-4,1))"])

    def first_values(seed: int) -> List[float]:
        out = []
        for w in range(4):
            s = Settings(space, n_trials=4, n_workers=4, sampler="random", seed=seed)
            study = optuna.create_study(sampler=studies.build_sampler(s, w))
            out.append(study.ask().suggest_float("lr", 1e-4, 1, log=True))
        return out

    a, b = first_values(0), first_values(1)
    assert not set(a) & set(b) and len(set(a)) == 4
    one = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask().suggest_float("lr", 1e-4, 1, log=True)
    assert b[0] == one


def test_tpe_learns_from_trials_paused_at_a_rung():
    """12 trials paused at the first rung (RUNNING in Optuna, a value at step 30): the sampler of an asha study
    takes them as pruned there, so TPE is past its 10 startup trials and samples near the best of them; Optuna
    alone counts no finished trial (it would sample at random, taking every paused trial as a bad one)."""
    import optuna

    space, _ = parse(["x=interval(0,1)"])
    s = Settings(space, n_trials=40, n_workers=4, sampler="tpe", seed=3, scheduler="asha", max_steps=90)
    plain = Settings(space, n_trials=40, n_workers=4, sampler="tpe", seed=3)

    def spread(settings: Settings) -> float:
        study = optuna.create_study(sampler=studies.build_sampler(settings, 0))
        for i in range(12):
            t = study.ask()
            x = (i + 0.5) / 12
            study._storage.set_trial_param(t._trial_id, "x", x, optuna.distributions.FloatDistribution(0, 1))
            t.report((x - 0.2) ** 2, 30)  # paused at the rung: still RUNNING
        got = [study.ask().suggest_float("x", 0, 1) for _ in range(16)]
        return sorted(abs(v - 0.2) for v in got)[len(got) // 2]  # the median distance to the best

    assert isinstance(studies.build_sampler(s, 0), studies.UnitSampler)
    guided, blind = spread(s), spread(plain)
    assert guided < blind / 2, (guided, blind)
