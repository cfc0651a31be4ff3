"""A study journal whose first line (``create_study``) was torn: the repair puts that line back, so the
earlier trials (the best one too) stay in the study and new trials are numbered after the highest one,
not from 0 again over the earlier trials' run dirs. A real Optuna journal in a temp sweep dir."""

import json

import optuna

from hpctrain.search import journal
from hpctrain.search import study as st


def test_a_torn_first_line_keeps_the_trials_and_numbering_goes_on_after_the_highest(tmp_path, capsys):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    (tmp_path / "sweep.json").write_text(json.dumps({"launcher": "local", "search": {"direction": "maximize"}}))
    (tmp_path / ".hpctrain").mkdir()

    def open_study():
        return optuna.create_study(storage=st.storage(tmp_path), study_name=st.STUDY_NAME, direction="maximize",
                                   load_if_exists=True)

    study = open_study()
    for value in (0.1, 0.9, 0.5):
        trial = study.ask()
        study.tell(trial, value)
    path = st.journal_path(tmp_path)
    with open(path, "rb") as f:
        lines = f.readlines()
    with open(path, "wb") as f:
        f.writelines([lines[0][:25] + b"\n"] + lines[1:])  # a node lost while writing the study's first line

    study = open_study()
    assert [t.number for t in study.trials] == [0, 1, 2]
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and study.best_trial.number == 1
    assert study.ask().number == 3
    assert "set aside" in capsys.readouterr().err


def test_the_repair_names_the_study_as_the_study_module_does():
    assert journal.STUDY_NAME == st.STUDY_NAME
