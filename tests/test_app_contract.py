"""The app contract (hpctrain/core/app_contract.py): one dataclass of hooks attached to the task function
and read by one function; hpctrain's app carries its own, any other Hydra app the plain one."""

import re
from pathlib import Path

import pytest

from hpctrain.core.app_contract import PLAIN, AppContract, attach, contract_of

pytestmark = pytest.mark.login

ROOT = Path(__file__).resolve().parents[1]


def test_hpctrains_app_carries_its_contract_through_hydra_main():
    from hpctrain import app
    from hpctrain.schema import RETUNABLE
    from hpctrain.submit.checks import validate_job

    for fn in (app.train, app.main):  # the task function, and hydra.main's wrapper around it
        c = contract_of(fn)
        assert c.validate is validate_job and c.objective_metric == "val/loss" and c.gpu_per_rank
        assert c.mutable_keys == frozenset(RETUNABLE) and "hpctrain.train.trainer" in c.preload


def test_any_other_function_has_the_plain_contract():
    def task(cfg):
        return 1.0

    assert contract_of(task) is PLAIN and PLAIN.validate is None and PLAIN.objective_metric is None
    mine = attach(task, AppContract(objective_metric="score"))
    assert mine is task and contract_of(task).objective_metric == "score"


def test_no_module_looks_up_a_hook_on_a_task_function_but_the_contract():
    hooks = re.compile(r"getattr\([^)]*[\"'](validate_job|unread_keys|mutable_keys|preload)[\"']")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "hpctrain").rglob("*.py") if hooks.search(p.read_text())]
    assert found == []
