"""A search worker's per-unit config (hpctrain.search.compose) equals Hydra's full compose of the same overrides."""

import pytest
from omegaconf import OmegaConf

from hpctrain.search.compose import Composer


@pytest.fixture
def loader_and_master(tmp_path):
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - model: a\n  - _self_\nlr: 0.1\nmax_steps: 10\n"
                                      "name: run-${lr}\nhydra:\n  job:\n    config:\n      override_dirname:\n"
                                      "        exclude_keys: [max_steps]\n")
    (conf / "model" / "a.yaml").write_text("width: 8\ndepth: 2\n")
    (conf / "model" / "b.yaml").write_text("width: 16\nscale: ${lr}\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra.job.chdir=false"], RunMode.MULTIRUN)
        yield loader, master


def _plain(cfg):
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("overrides", [
    ["max_steps=20", "lr=0.0123"],
    ["lr=3e-4", "max_steps=20"],
    ["model=b", "lr=0.5", "model.width=4"],
    ["lr=0.25", "model=b"],
    ["+extra=1", "lr=0.5"],
    [],
])
def test_a_units_config_equals_a_full_compose(loader_and_master, overrides):
    loader, master = loader_and_master
    composer = Composer(loader, master)
    composer(["lr=0.9", "max_steps=20"])  # an earlier unit of this worker: its copy must not leak
    got = composer(list(overrides))
    want = loader.load_sweep_config(master, list(overrides))
    for cfg in (got, want):  # the compose's own clock and place
        cfg.hydra.runtime.cwd = "-"
    assert _plain(got) == _plain(want)
    got_task, want_task = (OmegaConf.to_container(c, resolve=True) for c in
                           (OmegaConf.masked_copy(got, [k for k in got if k != "hydra"]),
                            OmegaConf.masked_copy(want, [k for k in want if k != "hydra"])))
    assert got_task == want_task
    assert got.hydra.job.override_dirname == want.hydra.job.override_dirname


def test_a_bad_override_fails_as_the_full_compose_does(loader_and_master):
    loader, master = loader_and_master
    with pytest.raises(Exception) as full:
        loader.load_sweep_config(master, ["nokey=1"])
    with pytest.raises(type(full.value)):
        Composer(loader, master)(["nokey=1"])


def test_hpctrains_own_config_composed_per_unit_equals_a_full_compose():
    """The trainer's config (structured schema, its run-dir resolvers): a searched float, a fixed group."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from hpctrain.schema import register_configs

    register_configs()
    with initialize_config_module(config_module="hpctrain.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["hydra/sweeper=search"], RunMode.MULTIRUN)
        composer = Composer(loader, master)
        composer(["max_steps=180", "lr=0.5"])
        for overrides in (["max_steps=180", "eval_every=10", "lr=0.0123"], ["optim=sgd", "lr=3e-4"]):
            got, want = composer(list(overrides)), loader.load_sweep_config(master, list(overrides))
            for cfg in (got, want):
                cfg.hydra.runtime.cwd = "-"
            assert _plain(got) == _plain(want), overrides
            assert got.lr == want.lr and type(got.lr) is float
