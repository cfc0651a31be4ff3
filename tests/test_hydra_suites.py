"""Hydra's own launcher test suites (the ones every Hydra launcher plugin runs), on hpctrain's launchers:
``local`` on this machine, ``slurm`` with ``wait=true`` on the real test cluster. The apps are Hydra's
generic test apps: nothing of hpctrain is imported by them."""

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

# The suites' fixtures (hydra_sweep_runner, hydra_restore_singletons) come from Hydra's pytest plugin.


@pytest.mark.parametrize("launcher_name, overrides", [("local", [])])
class TestLocalLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [
    ({}, ["-m", "hydra/launcher=local", "hydra/hydra_logging=disabled", "hydra/job_logging=disabled"]),
])
class TestLocalLauncherIntegration(IntegrationTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("launcher_name, overrides", [("slurm", ["hydra.launcher.wait=true"])])
class TestSlurmLauncher(LauncherTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [
    ({}, ["-m", "hydra/launcher=slurm", "hydra.launcher.wait=true", "hydra/hydra_logging=disabled",
          "hydra/job_logging=disabled"]),
])
class TestSlurmLauncherIntegration(IntegrationTestSuite):
    pass
