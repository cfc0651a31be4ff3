"""The submit side's work counted (independent of the machine's load): issue 31 item 3, 1,000 points queued
in under 1.5 s, where each of Hydra's compositions is about a tenth of that."""

import pytest
from omegaconf import OmegaConf

from hpctrain._compat.hydra import ConfigLoaderImpl, mode_composed_once

SWEEP = ["lr=1e-3,1e-2", "seed=range(3)", "max_steps=10", "hydra/launcher=slurm",
         "+hydra.launcher.additional_parameters.hold=true"]


@pytest.fixture
def hydra_app(tmp_path, monkeypatch):
    """Hydra as ``python -m hpctrain`` builds it, and a count of its compositions."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    from hpctrain.schema import register_configs

    monkeypatch.chdir(tmp_path)
    register_configs()
    calls = []
    impl = ConfigLoaderImpl._load_configuration_impl

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("overrides", args[1] if len(args) > 1 else None))
        return impl(self, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl", counted)
    hydra = Hydra.create_main_hydra2("app", create_automatic_config_search_path(None, None, "pkg://hpctrain.conf"))
    yield hydra, calls
    GlobalHydra.instance().clear()


def _multirun_config(hydra, overrides):
    """What ``_run_hydra`` and ``_run_app`` compose for ``-m``: ``get_mode``, then (``hydra.mode=MULTIRUN``
    appended where the config sets no mode, as ``_run_app`` does) ``multirun``'s own config."""
    from hydra.types import RunMode

    overrides = list(overrides)
    if hydra.get_mode(config_name="config", overrides=overrides) is None:
        overrides.append("hydra.mode=MULTIRUN")
    return hydra.compose_config("config", overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False)


def test_a_multirun_composes_its_config_once_and_the_same_config(hydra_app):
    hydra, calls = hydra_app
    plain = OmegaConf.to_container(_multirun_config(hydra, SWEEP), resolve=False)
    assert len(calls) == 2  # Hydra alone: get_mode's and multirun's
    calls.clear()
    with mode_composed_once():
        once = OmegaConf.to_container(_multirun_config(hydra, SWEEP), resolve=False)
    assert len(calls) == 1
    for cfg in (plain, once):  # composed at a different moment: the same but for the clock-free runtime
        cfg["hydra"]["runtime"].pop("output_dir", None)
    assert once == plain


def test_a_config_is_handed_on_once_and_multirun_still_validates_its_sweeps(hydra_app):
    from hydra.errors import ConfigCompositionException
    from hydra.types import RunMode

    hydra, calls = hydra_app
    with mode_composed_once():
        first = _multirun_config(hydra, SWEEP)
        again = hydra.compose_config("config", SWEEP + ["hydra.mode=MULTIRUN"], run_mode=RunMode.MULTIRUN)
        assert again is not first and len(calls) == 2  # the kept one went to multirun: a third caller composes
        calls.clear()
        bad = SWEEP + ["hydra.job.chdir=true,false"]  # get_mode skips the sweep check that multirun makes
        with pytest.raises(ConfigCompositionException, match="Sweeping over Hydra's configuration"):
            _multirun_config(hydra, bad)
        assert len(calls) == 2  # refused: Hydra composes it again and says why in its own words


def test_the_record_lists_the_distributions_as_their_metadata_says_in_few_calls():
    """Every submission's record names the launching environment's distributions: read from the metadata's
    header lines, the same names and versions as the e-mail parser gives, at a tenth of its calls."""
    import importlib.metadata

    from call_count import calls
    from hpctrain.submit import provenance

    dists = list(importlib.metadata.distributions())
    parsed = {d.metadata["Name"]: d.version for d in dists if d.metadata["Name"]}
    assert provenance._distributions() == dict(sorted(parsed.items(), key=lambda kv: kv[0].lower()))
    assert calls(provenance._distributions) / len(dists) < 1000  # 3,925 a distribution by the e-mail parser


# python -m hpctrain with Hydra's defaults-list builder and group merge counted (called through)
COUNTING = """
import sys
from hydra._internal import config_loader_impl as L
import copy
counts = {"defaults lists": 0, "group merges": 0, "repository copies": 0}
deepcopy = copy.deepcopy
def counted_deepcopy(x, memo=None, _nil=[]):
    counts["repository copies"] += type(x).__name__ == "ConfigRepository"
    return deepcopy(x, memo, _nil)
copy.deepcopy = counted_deepcopy
create, merge = L.create_defaults_list, L.ConfigLoaderImpl._compose_config_from_defaults_list
def counted_create(*a, **k):
    counts["defaults lists"] += 1
    return create(*a, **k)
def counted_merge(self, *a, **k):
    counts["group merges"] += 1
    return merge(self, *a, **k)
L.create_defaults_list, L.ConfigLoaderImpl._compose_config_from_defaults_list = counted_create, counted_merge
from hpctrain.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("COUNTS", counts["defaults lists"], counts["group merges"], counts["repository copies"])
"""


def test_a_sweep_command_builds_its_defaults_list_and_merges_its_groups_once(tmp_path):
    """The key check, Hydra's multirun and the plan's base compose the same config-group choices: Hydra's
    defaults list and group merge (about two thirds of a composition) once, not three times; and no
    composition deep-copies the loader's whole config repository (9 copies before) when no search path
    changes it."""
    import subprocess
    import sys

    argv = [*SWEEP[:3], "hydra/launcher=slurm", "model=mlp", "hydra.launcher.dry_run=true",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    out = subprocess.run([sys.executable, "-c", COUNTING, "-m", *argv], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert "dry run: nothing submitted" in out.stdout, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("COUNTS "))
    assert line.split()[1:] == ["1", "1", "0"], out.stdout  # 3, 3 and 9 before


@pytest.mark.parametrize("overrides", [
    SWEEP,
    ["model=cnn", "optim=sgd,adamw", "lr=0.1", "+extra.key=1"],
    ["+metrics=accuracy", "hydra.sweep.dir=elsewhere", "data=regression", "loss=mse"],
    ["hydra.searchpath=[pkg://hpctrain.conf]", "model=cnn", "lr=0.5"],  # the repository's sources changed
])
def test_shared_compositions_are_the_configs_hydra_composes(hydra_app, overrides):
    """Each composition within ``compositions_shared`` (the group merge copied from the first with the same
    choices) equals the same composition made alone, in both run modes and with other value overrides."""
    from hydra.types import RunMode

    from hpctrain._compat.hydra import compositions_shared

    hydra, calls = hydra_app
    loader = hydra.config_loader
    single = [o for o in overrides if "," not in o and "range(" not in o]  # run mode: no sweeps
    asks = [(overrides, RunMode.MULTIRUN), (single, RunMode.RUN),
            ([o for o in single if not o.startswith(("lr", "+extra"))], RunMode.RUN), (overrides, RunMode.MULTIRUN)]

    def plain(cfg):
        out = OmegaConf.to_container(cfg, resolve=False)
        out["hydra"]["runtime"].pop("output_dir", None)
        return out

    alone = [plain(loader.load_configuration("config", list(o), mode)) for o, mode in asks]
    with compositions_shared():
        shared = [plain(loader.load_configuration("config", list(o), mode)) for o, mode in asks]
    assert shared == alone


def test_run_mode_does_not_share_a_multirun_composition_that_skipped_a_missing_group(tmp_path):
    """Multirun skips a group default that is ``???`` (a sweep may give it); run mode refuses it: a run-mode
    composition is composed by Hydra, and refused, even after a multirun one with the same choices."""
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.errors import ConfigCompositionException
    from hydra.types import RunMode

    from hpctrain._compat.hydra import compositions_shared, config_loader

    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "a.yaml").write_text("x: 1\n")
    (tmp_path / "config.yaml").write_text("defaults:\n  - db: ???\n  - _self_\ny: 2\n")
    loader = config_loader(create_automatic_config_search_path(None, None, str(tmp_path)))
    with compositions_shared():
        multirun = loader.load_configuration("config", [], RunMode.MULTIRUN)
        assert "db" not in multirun and multirun.y == 2
        with pytest.raises(ConfigCompositionException, match="You must specify 'db'"):
            loader.load_configuration("config", [], RunMode.RUN)
        assert loader.load_configuration("config", ["db=a"], RunMode.RUN).db.x == 1
