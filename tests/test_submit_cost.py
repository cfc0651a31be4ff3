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
