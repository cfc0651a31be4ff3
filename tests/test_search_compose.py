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
        for overrides in (["max_steps=180", "eval_every=10", "lr=0.0123"], ["optim=sgd", "lr=3e-4"],
                          ["max_steps=180", "eval_every=10", "lr=0.25"]):  # the first's copy, reused
            got, want = composer(list(overrides)), loader.load_sweep_config(master, list(overrides))
            for cfg in (got, want):
                cfg.hydra.runtime.cwd = "-"
            assert _plain(got) == _plain(want), overrides
            assert got.lr == want.lr and type(got.lr) is float


def _run_job(loader, master, cfg, seen):
    """Hydra's own run_job on the unit's config (as the worker runs a unit), its task recording what it got."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    from omegaconf import open_dict

    with open_dict(cfg):  # as the worker names each unit's run
        cfg.hydra.sweep.subdir = f"trial-{len(seen)}"
        cfg.hydra.job.num = len(seen)
        cfg.hydra.job.id = f"w_trial{len(seen)}"
    ctx = HydraContext(config_loader=loader, callbacks=Callbacks(cfg))
    ret = run_job(hydra_context=ctx, task_function=lambda c: seen.append(OmegaConf.to_container(c, resolve=True)),
                  config=cfg, job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
                  configure_logging=False)
    assert ret.status.name == "COMPLETED", ret._return_value


def _equal_to_full(loader, master, got, overrides):
    want = loader.load_sweep_config(master, list(overrides))
    for cfg in (got, want):
        cfg.hydra.runtime.cwd = "-"
    assert _plain(got) == _plain(want), overrides
    assert OmegaConf.is_readonly(got.hydra) == OmegaConf.is_readonly(want.hydra)
    assert OmegaConf.is_struct(got) == OmegaConf.is_struct(want)


@pytest.mark.parametrize("values", [
    [["max_steps=20", "lr=0.1"], ["max_steps=20", "lr=0.2"], ["max_steps=20", "lr=0.3"]],  # PBT: new values
    [["lr=0.1", "model=b"], ["lr=0.5", "model=b"]],  # another base: its own working copy
    [["lr=0.1"], ["lr=0.1"]],  # an ASHA promotion: the same values again
    [["++extra=1", "lr=0.1"], ["++extra=2", "lr=0.3"]],
])
def test_units_after_a_run_compose_with_their_own_values_not_the_last_units(tmp_path, loader_and_master, values):
    """The working copy is reused across units (the same object), after Hydra's run_job wrote into it: each
    unit's config still equals a full compose of its own overrides, and its task gets its own values."""
    loader, master = loader_and_master
    with open_dict_hydra(master):
        master.hydra.sweep.dir = str(tmp_path / "sweep")
    composer = Composer(loader, master)
    seen, configs = [], []
    for overrides in values:
        cfg = composer(list(overrides))
        _equal_to_full(loader, master, cfg, overrides)
        configs.append(cfg)
        _run_job(loader, master, cfg, seen)
        assert seen[-1]["lr"] == float(overrides[-1 if overrides[-1].startswith("lr") else 0].split("=")[1])
        assert seen[-1]["name"] == f"run-{seen[-1]['lr']}"  # an interpolation of a swept key: this unit's
    assert all(c is configs[0] for c in configs)  # reused, not copied (else this test tests nothing new)


def open_dict_hydra(cfg):
    from omegaconf import open_dict, read_write
    from contextlib import ExitStack

    stack = ExitStack()
    stack.enter_context(read_write(cfg.hydra))
    stack.enter_context(open_dict(cfg.hydra))
    return stack


@pytest.mark.parametrize("first, then", [
    (["lr=0.1", "max_steps=20"], ["lr=0.2"]),  # a key the earlier unit set, not set now
    (["lr=0.1", "max_steps=20"], ["max_steps=30", "lr=0.2"]),  # the same keys, another order
    (["+extra=1", "lr=0.1"], ["+extra=2", "lr=0.1"]),  # an append cannot be applied twice
    (["model=b", "model.width=4"], ["model=b", "~model.scale"]),  # a delete
    (["lr=0.1", "model.width=4"], ["lr=0.1", "model={width:3}"]),  # a dict merges
])
def test_a_unit_that_cannot_reuse_the_copy_gets_a_fresh_one_equal_to_a_full_compose(tmp_path, loader_and_master,
                                                                                      first, then):
    loader, master = loader_and_master
    with open_dict_hydra(master):
        master.hydra.sweep.dir = str(tmp_path / "sweep")
    composer = Composer(loader, master)
    seen = []
    earlier = composer(list(first))
    _run_job(loader, master, earlier, seen)
    got = composer(list(then))
    assert got is not earlier
    _equal_to_full(loader, master, got, then)


def test_a_failed_unit_config_leaves_no_half_applied_copy(loader_and_master):
    loader, master = loader_and_master
    composer = Composer(loader, master)
    composer(["lr=0.1", "model.width=4"])
    with pytest.raises(Exception):
        composer(["max_steps=7", "model.width.x=4"])  # max_steps set, then the second override fails
    _equal_to_full(loader, master, composer(["lr=0.3", "model.width=5"]), ["lr=0.3", "model.width=5"])


def test_a_config_with_hydra_callbacks_gets_a_fresh_copy_every_unit(tmp_path):
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text("lr: 0.1\nhydra:\n  callbacks:\n    noop:\n"
                                      "      _target_: hydra.experimental.callback.Callback\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", [], RunMode.MULTIRUN)
        composer = Composer(loader, master)
        first = composer(["lr=0.2"])
        assert composer(["lr=0.3"]) is not first
