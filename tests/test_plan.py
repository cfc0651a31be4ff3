"""The launcher's plan (hpctrain/submit/plan.py): its shortcuts give what Hydra and OmegaConf give.

The plan shares one resolved plain copy between a sweep's points and names run dirs without OmegaConf's
resolver; each point's shortcut result is compared here with a full resolve of that point's own config, and
each run dir (the dry run lists them) with OmegaConf's resolve of the config's ``hydra.sweep.subdir``.
"""

import json
import subprocess
import sys
from typing import List, Tuple

import pytest
from omegaconf import OmegaConf

from cli_helpers import hpctrain_env
from hpctrain.schema import DIRNAME_TEMPLATE, register_configs

pytestmark = pytest.mark.login  # login-node code: also run against the oldest and newest pinned Hydra

# `python -m hpctrain ARGS` in a fresh interpreter (Hydra's plugin scan re-executes the launcher's modules,
# which an in-process run after other tests would trip over), with hpctrain's validate_job spied on: every
# point's full resolve and the plan's plain copy go to the file named by argv[1], as JSON.
DRIVER = """
import dataclasses, json, sys
from omegaconf import OmegaConf
import os
from hpctrain.__main__ import main
from hpctrain.app import train
import hpctrain.submit.keys
if os.environ.get("PLAN_ONLY"):  # the plan's own handling of bad points: the login check that refuses first, off
    hpctrain.submit.keys.command_line_problems = lambda *args, **kwargs: []
from hpctrain.core.app_contract import attach, contract_of

seen, real, out = [], contract_of(train).validate, sys.argv[1]  # main() rewrites sys.argv

def spy(cfg, world_size=1, plain=None):
    seen.append([OmegaConf.to_container(cfg, resolve=True), plain])
    return real(cfg, world_size=world_size, plain=plain)

attach(train, dataclasses.replace(contract_of(train), validate=spy))
try:
    main(sys.argv[2:])
finally:
    with open(out, "w") as f:
        json.dump(seen, f, default=str)
"""


def _dry_run(tmp_path, *args: str, plan_only: bool = False) -> Tuple[List[tuple], subprocess.CompletedProcess]:
    """A dry run of ``-m ARGS`` on the local launcher: every point's (full resolve, plain copy), and the process.
    ``plan_only``: without the login check of the keys and values (hpctrain.submit.keys), which refuses a bad
    value before the plan sees it."""
    out = tmp_path / f"seen-{len(list(tmp_path.glob('seen-*')))}.json"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(out), "-m", *args, "hydra/launcher=local",
                           "hydra.launcher.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"],
                          cwd=tmp_path, env=hpctrain_env({"PLAN_ONLY": "1"} if plan_only else {}),
                          capture_output=True, text=True, timeout=120)
    assert out.exists(), proc.stderr[-3000:]
    seen = [tuple(pair) for pair in json.loads(out.read_text())]
    return seen, proc


def test_shared_plain_copy_equals_a_full_resolve_of_each_point(tmp_path):
    # data.num_features feeds model.in_features by interpolation; model=cnn is a second composed base
    seen, _ = _dry_run(tmp_path, "lr=1e-3,2e-2", "data.num_features=8,12", "max_steps=7")
    seen += _dry_run(tmp_path, "model=cnn", "data=images", "lr=1e-3,3e-3", "+model.dropout=0.1,0.2")[0]
    assert len(seen) == 8
    shared = [plain for _, plain in seen if plain is not None]
    assert len(shared) == 4  # the first sweep's points; `+key=` points are resolved whole
    for full, plain in seen:
        if plain is not None:
            assert plain == full
    features = [(full["data"]["num_features"], full["model"]["in_features"]) for full, _ in seen[:4]]
    assert features == [(8, 8), (12, 12), (8, 8), (12, 12)]
    assert [full["lr"] for full, _ in seen[:4]] == [1e-3, 1e-3, 2e-2, 2e-2]


def test_run_dir_names_are_hydras(tmp_path):
    long = "x" * 150
    out = _dry_run(tmp_path, "lr=1e-3,2e-3", f"+model.tag={long},a/b")[1].stdout
    listed = [line.split()[-1].rsplit("/", 1)[-1] for line in out.splitlines() if line.startswith("  ") and "/s/" in line]
    # what OmegaConf makes of conf/config.yaml's hydra.sweep.subdir in the job, for each point
    register_configs()  # its resolver, as the job registers it
    expected = [str(OmegaConf.create({"hydra": {"job": {"num": i, "override_dirname": d}}, "name": DIRNAME_TEMPLATE}).name)
                for i, d in enumerate([f"+model.tag={long},lr=0.001", "+model.tag=a/b,lr=0.001",
                                       f"+model.tag={long},lr=0.002", "+model.tag=a/b,lr=0.002"])]
    assert listed == expected
    assert len(listed[0]) == 120 and listed[1] == "1_+model.tag=a%2Fb,lr=0.001"


def test_a_bad_point_between_good_ones_leaves_them_exact(tmp_path):
    # the shared working config is partly updated by the bad point: the next point must not inherit that
    seen, proc = _dry_run(tmp_path, "seed=1,2", "lr=1e-3,abc,2e-3", "max_steps=5,x", plan_only=True)
    assert proc.returncode != 0
    err = proc.stderr
    # the launcher says each bad swept value once (hpctrain.submit.keys.swept_problems), not once per point
    assert [line.strip() for line in err.splitlines() if line.startswith("  ")] == [
        "lr=abc: expected a number", "max_steps=x: expected an integer"], err
    good = [(full["seed"], full["lr"], full["max_steps"]) for full, plain in seen if plain == full]
    assert good == [(1, 1e-3, 5), (1, 2e-3, 5), (2, 1e-3, 5), (2, 2e-3, 5)]


def test_grid_points_each_get_their_own_values(tmp_path):
    seen, _ = _dry_run(tmp_path, "seed=1,2,3", "lr=1e-3,2e-3", "data.num_features=4,6", "max_steps=9")
    assert len(seen) == 12 and all(plain == full for full, plain in seen)
    got = [(full["seed"], full["lr"], full["data"]["num_features"], full["model"]["in_features"]) for full, _ in seen]
    assert got == [(s, lr, f, f) for s in (1, 2, 3) for lr in (1e-3, 2e-3) for f in (4, 6)]


def test_a_value_a_failed_point_left_behind_is_applied_again():
    """Unit check of the shared working config: a point that fails on its second key has already changed
    its first; the next point, back at the first key's old value, must get that value again."""
    from dataclasses import dataclass

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain.submit.plan import _Base, _point_config

    @dataclass
    class Cfg:
        a: int = 0
        b: int = 0

    base = _Base(task=OmegaConf.structured(Cfg), subdir="", sweep_dir="", job_name="", dirname={}, template=None)
    parser = OverridesParser.create()
    got = []
    for point in (["a=1", "b=1"], ["a=2", "b=x"], ["a=1", "b=2"]):
        try:
            cfg = _point_config(base, parser.parse_overrides(point))
        except Exception:  # noqa: BLE001 - b=x is not an int
            got.append("error")
            continue
        got.append((cfg.a, cfg.b))
    assert got == [(1, 1), "error", (1, 2)]


def _listed(out: str) -> List[str]:
    return [line.split()[-1].rsplit("/", 1)[-1] for line in out.splitlines() if line.startswith("  ") and "/s/" in line]


def test_run_dir_names_use_the_parsed_values(tmp_path):
    """lr="1e-3" runs as 0.001 and is named so: one name however the value was written, no quotes."""
    out = _dry_run(tmp_path, 'lr="1e-3",1e-3,0.001,"2.5e-3"', "+model.tag='x',true")[1].stdout
    assert _listed(out) == ["0_+model.tag=x,lr=0.001", "1_+model.tag=true,lr=0.001", "2_+model.tag=x,lr=0.001",
                            "3_+model.tag=true,lr=0.001", "4_+model.tag=x,lr=0.001", "5_+model.tag=true,lr=0.001",
                            "6_+model.tag=x,lr=0.0025", "7_+model.tag=true,lr=0.0025"]
    for i, one in enumerate(('lr="1e-3"', "lr=1e-3", "lr=.001")):  # a sweep of one point names its key too
        (tmp_path / str(i)).mkdir()
        assert _listed(_dry_run(tmp_path / str(i), one)[1].stdout) == ["0_lr=0.001"], one


def test_a_rerun_finds_the_run_dirs_an_older_version_named_as_typed(tmp_path):
    """Before names by value, a run dir was named by its override as typed (0_lr="1e-3"): a rerun keeps it."""
    (tmp_path / "s" / '0_lr="1e-3"').mkdir(parents=True)
    assert _listed(_dry_run(tmp_path, 'lr="1e-3"')[1].stdout) == ['0_lr="1e-3"']
    (tmp_path / "s" / "0_lr=0.001").mkdir()  # both there: the name by value
    assert _listed(_dry_run(tmp_path, 'lr="1e-3"')[1].stdout) == ["0_lr=0.001"]
