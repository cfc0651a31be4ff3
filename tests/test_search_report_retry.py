"""A mid-trial report (the trainer's eval, through the trial bridge) survives a journal that cannot be read
for a moment: it is retried on a fresh study; a journal that stays unreadable costs the report, not the run."""

import os
import threading
import time
from pathlib import Path

from hpctrain._compat.optuna import live_trial, trial_id
from hpctrain.search import study as studies
from hpctrain.search.bridge import TrialBridge
from hpctrain.search.settings import Settings
from hpctrain.search.space import parse


def _settings() -> Settings:
    space, _ = parse(["x=interval(0,1)"])
    return Settings(space=space, n_trials=2, n_workers=1, sampler="random", pruner="median", seed=0)


def _running_trial(sweep: Path) -> TrialBridge:
    study = studies.open_study(sweep, _settings())
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    return TrialBridge(trial.number, "val/loss", live_trial(study, trial_id(trial)), run_dir=str(sweep / "trial-000"))


def _unreadable(journal: str) -> str:
    """The journal replaced by a directory (every read of it fails with an OSError); returns where it went."""
    aside = journal + ".away"
    os.rename(journal, aside)
    os.mkdir(journal)
    return aside


def _restore(journal: str, aside: str) -> None:
    os.rmdir(journal)
    os.rename(aside, journal)


def test_a_report_is_retried_on_a_fresh_study_after_a_journal_read_error(tmp_path, capsys):
    bridge = _running_trial(tmp_path)
    journal = studies.journal_path(tmp_path)
    aside = _unreadable(journal)
    threading.Timer(0.3, _restore, (journal, aside)).start()  # readable again before the first retry
    assert bridge.should_prune(1.5, 10) is False  # the attempt goes on
    (t,) = studies.open_study(tmp_path, _settings()).get_trials()
    assert t.intermediate_values == {10: 1.5}
    assert "retrying" in capsys.readouterr().out


def test_a_journal_unreadable_through_every_retry_costs_the_report_not_the_run(tmp_path, capsys):
    bridge = _running_trial(tmp_path)
    journal = studies.journal_path(tmp_path)
    aside = _unreadable(journal)
    started = time.monotonic()
    try:
        assert bridge.should_prune(1.5, 10) is False
    finally:
        _restore(journal, aside)
    assert time.monotonic() - started < 10
    assert "this eval is not reported, the run goes on" in capsys.readouterr().out
    assert bridge.should_prune(2.5, 20) is False  # the next eval reports again
    assert bridge.reported == {20: 2.5}
