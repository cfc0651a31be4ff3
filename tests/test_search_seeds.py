"""A worker's sampler seed: a restarted or rerun worker does not draw its earlier values again."""

from pathlib import Path
from typing import List

from hpctrain.search import study as studies
from hpctrain.search.settings import Settings
from hpctrain.search.space import parse


def _settings() -> Settings:
    space, problems = parse(["x=interval(0,1)"])
    assert problems == []
    return Settings(space=space, n_trials=6, n_workers=2, sampler="tpe", seed=0)


def _run_worker(sweep: Path, s: Settings, worker: int, n: int) -> List[float]:
    """What worker ``worker`` samples for ``n`` new trials, from a freshly opened study (a new process)."""
    study = studies.open_study(sweep, s, worker)
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(trial.suggest_float("x", 0, 1))
        study.tell(trial, out[-1])
    return out


def test_a_rerun_worker_draws_new_values_and_the_rule_is_reproducible(tmp_path):
    """Seeded by its index alone, worker 1 of a rerun drew TPE's start-up values of the first run again
    (2 of 6 trials were copies)."""
    s = _settings()
    first, rerun, again = (_run_worker(tmp_path / "a", s, 1, 2) for _ in range(3))
    assert len(set(first + rerun + again)) == 6, (first, rerun, again)
    replay = [_run_worker(tmp_path / "b", s, 1, 2) for _ in range(3)]  # the same history: the same draws
    assert replay == [first, rerun, again]


def test_a_requeued_worker_draws_new_values(tmp_path, monkeypatch):
    s = _settings()
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    before = studies.open_study(tmp_path / "a", s, 1).sampler
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    after = studies.open_study(tmp_path / "b", s, 1).sampler  # the same (empty) study, the next attempt
    import optuna

    draw = [optuna.create_study(sampler=x).ask().suggest_float("x", 0, 1) for x in (before, after)]
    assert draw[0] != draw[1]
    assert studies.worker_seed(0, 0) == 0  # worker 0 of a new study keeps the study's seed
