"""PBT's decisions (hpctrain.search.pbt, property-based), its files (hpctrain.search.exploit) and the
refusals of parameters it cannot explore."""

import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpctrain.core import summary
from hpctrain.schema import RETUNABLE
from hpctrain.core.state import Direction, State
from hpctrain.search import exploit, pbt
from hpctrain.search.space import parse
from hpctrain.search.units import Next, StudyView, TrialView, Unit, UnitKind

SPACE, _ = parse(["lr=tag(log,interval(1e-4,1e-1))", "optim.weight_decay=interval(0.0,0.3)",
                  "optim.momentum=choice(0.8,0.9,0.95,0.99)"])


def in_space(params):
    for p in SPACE.params:
        v = params[p.name]
        if p.kind == "categorical":
            assert v in p.choices
        else:
            assert p.low <= v <= p.high


params_st = st.fixed_dictionaries({
    "lr": st.floats(1e-4, 1e-1), "optim.weight_decay": st.floats(0.0, 0.3),
    "optim.momentum": st.sampled_from([0.8, 0.9, 0.95, 0.99])})
value_st = st.one_of(st.floats(-10, 10), st.just(float("nan")), st.none())


@st.composite
def populations(draw):
    n = draw(st.integers(2, 12))
    step = draw(st.sampled_from([5, 10, 20]))
    members = []
    for i in range(n):
        v = draw(value_st)
        members.append(pbt.Member(i, draw(params_st), {} if v is None else {step: v}, step))
    return members, step


@settings(max_examples=200, deadline=None)
@given(populations(), st.floats(0.05, 0.5), st.floats(0.0, 1.0), st.booleans(), st.integers(0, 5))
def test_a_donor_is_always_of_the_top_quantile_and_values_stay_in_the_space(pop, quantile, resample_p, minimize,
                                                                          seed):
    members, step = pop
    top, bottom = pbt.quantiles(members, step, quantile, minimize)
    assert not {m.number for m in top} & {m.number for m in bottom}
    finite = sorted(m.value_at(step) for m in members if m.value_at(step) is not None)
    for m in members:
        d = pbt.decide(m, members, SPACE, quantile=quantile, resample_p=resample_p, minimize=minimize, seed=seed)
        assert d.step == step
        in_space(d.params)
        if d.copy_from is None:
            assert d.params == dict(m.params)
            continue
        assert m.number in {b.number for b in bottom}
        donor = members[d.copy_from]
        assert donor.number in {t.number for t in top}
        k = len(top)
        best = finite[:k] if minimize else finite[::-1][:k]
        assert donor.value_at(step) in best  # the donor's value is among the k best
        # the same question gets the same answer (a unit asked again after its worker died)
        assert pbt.decide(m, members, SPACE, quantile=quantile, resample_p=resample_p, minimize=minimize,
                          seed=seed) == d


def test_the_bottom_exploits_and_the_top_continues():
    members = [pbt.Member(i, {"lr": 0.01 * (i + 1), "optim.weight_decay": 0.1, "optim.momentum": 0.9},
                          {10: float(v)}, 10) for i, v in enumerate([0.5, 0.1, 0.9, 0.3])]
    decisions = {m.number: pbt.decide(m, members, SPACE, quantile=0.25, seed=0) for m in members}
    assert decisions[2].copy_from == 1  # worst copies best
    assert [decisions[n].copy_from for n in (0, 1, 3)] == [None, None, None]
    assert decisions[1].params == dict(members[1].params)
    maxi = {m.number: pbt.decide(m, members, SPACE, quantile=0.25, minimize=False, seed=0) for m in members}
    assert maxi[1].copy_from == 2


def test_a_member_without_a_value_exploits_and_none_is_a_donor():
    members = [pbt.Member(0, {"lr": 0.01}, {5: float("nan")}, 5), pbt.Member(1, {"lr": 0.01}, {}, 5),
               pbt.Member(2, {"lr": 0.02}, {5: 1.0}, 5), pbt.Member(3, {"lr": 0.03}, {5: 2.0}, 5),
               pbt.Member(4, {"lr": 0.03}, {5: 3.0}, 5)]
    top, bottom = pbt.quantiles(members, 5, 0.25, True)
    assert [m.number for m in top] == [2]
    assert {m.number for m in bottom} == {0, 1}
    nothing = [pbt.Member(i, {"lr": 0.01}, {}, 5) for i in range(4)]
    assert all(pbt.decide(m, nothing, SPACE).copy_from is None for m in nothing)


@settings(max_examples=300, deadline=None)
@given(params_st, st.floats(0.0, 1.0), st.integers(0, 10_000))
def test_explore_perturbs_by_0_8_or_1_2_clipped_or_resamples(params, resample_p, seed):
    rng = random.Random(seed)
    out = pbt.explore(params, SPACE, resample_p, rng)
    in_space(out)
    if resample_p == 0.0:
        for name, (low, high) in {"lr": (1e-4, 1e-1), "optim.weight_decay": (0.0, 0.3)}.items():
            assert any(math.isclose(out[name], min(high, max(low, params[name] * f))) for f in (0.8, 1.2))
        choices = [0.8, 0.9, 0.95, 0.99]
        assert abs(choices.index(out["optim.momentum"]) - choices.index(params["optim.momentum"])) == 1


def views_until_done(population, interval, max_steps, workers, seed):
    """Drive the scheduler as workers would (units started and finished in a random order); every unit."""
    rng = random.Random(seed)
    sched = pbt.PBT(SPACE, population, interval, max_steps, seed=seed)
    trials, running, units = [], [], []
    for _ in range(10_000):
        view = StudyView(trials, n_trials=population, max_steps=max_steps, direction=Direction.MIN)
        got = sched.next_unit(view) if len(running) < workers else Next.IDLE
        if isinstance(got, Unit):
            if got.kind is UnitKind.NEW:
                got = got.numbered(len(trials))
                trials.append(TrialView(got.trial, State.RUNNING, {"lr": 0.01, "optim.weight_decay": 0.1,
                                                                   "optim.momentum": 0.9}, {}, got))
            else:
                t = trials[got.trial]
                assert t.state is State.PAUSED and t.unit.end_step == got.start_step
                # decided once the whole population reached the boundary (synchronous generations)
                assert all(pbt.member_of(x, max_steps).step >= got.start_step for x in trials)
                if got.copy_from is not None:
                    assert pbt.member_of(trials[got.copy_from], max_steps).step >= got.start_step
                t.state, t.unit = State.RUNNING, got
            units.append(got)
            running.append(got.trial)
            continue
        if got is Next.DONE:
            assert not running
            return trials, units
        assert running, "IDLE with nothing running: the study would never end"
        t = trials[running.pop(rng.randrange(len(running)))]
        t.values[t.unit.end_step] = rng.random()
        t.state = State.PAUSED if t.unit.end_step < max_steps else State.COMPLETED
        assert len(trials) <= population
    raise AssertionError("no end")


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(1, 4), st.integers(1, 5), st.integers(0, 100))
def test_the_population_never_changes_and_every_member_trains_to_the_end(population, intervals, workers, seed):
    interval = 5
    trials, units = views_until_done(population, interval, interval * intervals, workers, seed)
    assert len(trials) == population
    assert sum(u.kind is UnitKind.NEW for u in units) == population
    for t in trials:
        mine = [u for u in units if u.trial == t.number]
        assert [(u.start_step, u.end_step) for u in mine] == [(k * interval, (k + 1) * interval)
                                                               for k in range(intervals)]
        assert all(u.kind is UnitKind.CONTINUE for u in mine[1:])
        for u in mine[1:]:
            in_space(u.params)
            assert u.copy_from != u.trial


def test_check_params_refuses_what_pbt_cannot_explore_in_one_line():
    ok, _ = parse(["lr=tag(log,interval(1e-4,1e-1))", "optim.momentum=choice(0.9,0.99)"])
    assert pbt.check_params(ok, RETUNABLE) is None
    for arg, says in [("model.hidden=choice(16,32)", "cannot change 'model.hidden' mid-run"),
                      ("batch_size=choice(32,64)", "cannot change 'batch_size' mid-run"),
                      ("lr=tag(int,interval(1,5))", "continuous intervals and choices only"),
                      ("lr=range(0.1,0.5,0.1)", "continuous intervals and choices only")]:
        space, problems = parse([arg])
        assert not problems
        line = pbt.check_params(space, RETUNABLE)
        assert line is not None and says in line and "\n" not in line, line
    anything, _ = parse(["model.hidden=choice(16,32)"])
    assert pbt.check_params(anything, None) is None  # an app that does not say what it can change


def test_the_schedule_follows_exploits_back_to_the_donors():
    lineages = {
        0: [pbt.lineage_entry(0, None, {"lr": 0.1}), pbt.lineage_entry(5, None, {"lr": 0.1}),
            pbt.lineage_entry(10, None, {"lr": 0.1})],
        1: [pbt.lineage_entry(0, None, {"lr": 0.01}), pbt.lineage_entry(5, 0, {"lr": 0.08}),
            pbt.lineage_entry(10, None, {"lr": 0.08})],
        2: [pbt.lineage_entry(0, None, {"lr": 0.001}), pbt.lineage_entry(5, None, {"lr": 0.001}),
            pbt.lineage_entry(10, 1, {"lr": 0.064})],
    }
    assert pbt.schedule(2, lineages) == [{"step": 0, "params": {"lr": 0.1}}, {"step": 5, "params": {"lr": 0.08}},
                                         {"step": 10, "params": {"lr": 0.064}}]
    assert pbt.schedule(0, lineages) == [{"step": 0, "params": {"lr": 0.1}}]
    over = pbt.replay_overrides(pbt.schedule(2, lineages))
    assert over == ["lr=0.1", "schedule=[{step:5,lr:0.08},{step:10,lr:0.064}]"]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (o,) = OverridesParser.create().parse_overrides([over[1]])
    assert o.value() == [{"step": 5, "lr": 0.08}, {"step": 10, "lr": 0.064}]


# ---------------------------------------------------------------- files
def checkpoint(run_dir: Path, text: str) -> None:
    d = run_dir / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    if (d / "last.pt").exists():
        (d / "last.pt").replace(d / "previous.pt")  # as the trainer's save_atomic
    (d / "last.pt").write_text(text)


def test_an_exploit_copies_the_donors_boundary_and_never_moves_it(tmp_path):
    donor, me = tmp_path / "donor", tmp_path / "me"
    checkpoint(donor, "donor@5")
    checkpoint(me, "me@5")
    exploit.after_unit(donor, 5, 15)
    exploit.after_unit(me, 5, 15)
    checkpoint(donor, "donor@8")  # the donor trained on: its kept boundary is unchanged
    assert (exploit.kept_dir(donor, 5) / "last.pt").read_text() == "donor@5"
    exploit.before_unit(me, 5, {"lr": 0.2}, donor, 0)
    assert (me / "checkpoints" / "last.pt").read_text() == "donor@5"
    assert not (me / "checkpoints" / "previous.pt").exists()
    assert (exploit.kept_dir(me, 5) / "last.pt").read_text() == "donor@5"
    assert (exploit.kept_dir(donor, 5) / "last.pt").read_text() == "donor@5"
    assert (donor / "checkpoints" / "last.pt").read_text() == "donor@8"
    checkpoint(me, "me@8")
    exploit.before_unit(me, 5, {"lr": 0.2}, donor, 0)  # the unit again (its worker died): what it trained stays
    assert (me / "checkpoints" / "last.pt").read_text() == "me@8"
    assert summary.read(me)["lineage"] == [{"step": 5, "parent": 0, "params": {"lr": 0.2}}]
    exploit.record(me, 0, None, {"lr": 0.1})
    assert [e["step"] for e in summary.read(me)["lineage"]] == [0, 5]
    with pytest.raises(FileNotFoundError):
        exploit.copy_from(donor, 10, tmp_path / "other")


def test_kept_boundaries_go_once_no_unit_needs_them(tmp_path):
    checkpoint(tmp_path, "a")
    exploit.after_unit(tmp_path, 5, 20)
    checkpoint(tmp_path, "b")
    exploit.after_unit(tmp_path, 10, 20)
    exploit.after_unit(tmp_path, 20, 20)  # the end: nothing to keep for
    assert exploit.kept_steps(tmp_path) == [5, 10]
    exploit.before_unit(tmp_path, 10, {"lr": 0.1})
    assert exploit.kept_steps(tmp_path) == [10]
    assert (exploit.kept_dir(tmp_path, 10) / "last.pt").read_text() == "b"


@pytest.mark.parametrize("space, says", [
    ("model.hidden=choice(16,32)", "model.hidden=choice(16,32): scheduler=pbt cannot change 'model.hidden' mid-run"),
    ("lr=range(0.01,0.05,0.01)", "lr=range(0.01,0.05,0.01): scheduler=pbt perturbs continuous intervals and choices only"),
])
def test_the_login_node_refuses_a_pbt_parameter_in_one_line_and_submits_nothing(tmp_path, space, says):
    from cli_helpers import run_hpctrain

    sweep = tmp_path / "sweep"
    proc = run_hpctrain(["-m", "hydra/sweeper=search", "hydra/launcher=local", f"hydra.sweep.dir={sweep}", space,
                         "hydra.sweeper.scheduler=pbt", "hydra.sweeper.population=4", "hydra.sweeper.interval=5",
                         "max_steps=20", "eval_every=5"], cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode != 0
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  ")]
    assert len(problems) == 1 and says in problems[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (sweep / ".hpctrain" / "study.journal").exists()
