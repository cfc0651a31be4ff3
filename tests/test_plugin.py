"""The Hydra plugin is a thin shell: an unrelated app pays nothing for it, and no module runs twice."""

import subprocess
import sys
import textwrap

import pytest

from cli_helpers import hpctrain_env

pytestmark = pytest.mark.login

TRIVIAL_APP = textwrap.dedent('''
    import sys
    import hydra

    @hydra.main(version_base="1.3", config_path=None)
    def main(cfg):
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("hpctrain", "submitit", "torch", "optuna")
                     or m.startswith("hydra_plugins.hpctrain_launcher")))

    main()
''')


def test_an_unrelated_hydra_app_imports_nothing_of_hpctrain(tmp_path):
    (tmp_path / "app.py").write_text(TRIVIAL_APP)
    proc = subprocess.run([sys.executable, "app.py", "hydra.run.dir=out"], cwd=tmp_path, env=hpctrain_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = eval(proc.stdout.strip().splitlines()[-1])
    # the scan found the plugin (its two modules) and imported nothing behind it
    assert loaded == ["hydra_plugins.hpctrain_launcher", "hydra_plugins.hpctrain_launcher.config",
                      "hydra_plugins.hpctrain_launcher.plugins"], loaded


def test_the_classes_hydra_registers_are_the_ones_it_instantiates(tmp_path):
    code = textwrap.dedent('''
        import importlib
        from hydra import compose, initialize
        from hydra.core.plugins import Plugins
        from hydra.plugins.launcher import Launcher
        from hydra.plugins.sweeper import Sweeper
        with initialize(version_base="1.3", config_path=None):
            compose(overrides=["hydra/launcher=local"], return_hydra_config=True)
        found = {c.__qualname__: c for c in Plugins.instance().discover(Launcher) + Plugins.instance().discover(Sweeper)}
        plugins = importlib.import_module("hydra_plugins.hpctrain_launcher.plugins")
        for name in ("LocalLauncher", "SlurmLauncher", "HpctrainSweeper", "SearchSweeper"):
            assert found[name] is getattr(plugins, name), name
        print("ok")
    ''')
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=hpctrain_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_a_launcher_setting_of_the_wrong_type_is_one_line_naming_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "-m", "lr=1e-3", "hydra/launcher=local",
                           "hydra.launcher.timeout_min=abc", f"hydra.sweep.dir={tmp_path / 's'}"],
                          cwd=tmp_path, env=hpctrain_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("nothing submitted: hydra.launcher.timeout_min: Value 'abc'"), proc.stderr
    assert "HYDRA_FULL_ERROR" not in proc.stderr  # the one line is the whole story
    assert not (tmp_path / "s" / "sweep.json").exists()


def test_a_colon_in_the_sweep_dir_or_the_launch_dir_is_refused_on_the_login_node(tmp_path):
    for cwd, sweep in ((tmp_path, tmp_path / "a:b"), (tmp_path / "c:d", tmp_path / "s")):
        cwd.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "hpctrain", "-m", "lr=1e-3", "hydra/launcher=local",
                               f"hydra.sweep.dir={sweep}"], cwd=cwd, env=hpctrain_env(), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1
        assert "expected a path without ':'" in proc.stderr.strip().splitlines()[0], proc.stderr
        assert not sweep.exists() or not any(sweep.iterdir())


def test_the_plain_nodes_hydra_scans_are_the_typed_settings_defaults():
    from dataclasses import asdict

    from hpctrain.search.settings import SearchSweeperConf
    from hpctrain.submit import settings
    from hydra_plugins.hpctrain_launcher import config

    assert config.SWEEPER == asdict(settings.SweeperConf())
    assert config.SEARCH_SWEEPER == asdict(SearchSweeperConf())
    assert config.LOCAL_LAUNCHER == asdict(settings.LocalLauncherConf())
    assert config.SLURM_LAUNCHER == asdict(settings.SlurmLauncherConf())
