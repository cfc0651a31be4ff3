"""Hydra's own launcher test suites (the ones every Hydra launcher plugin runs), on hpctrain's launchers:
``local`` on this machine, ``slurm`` with ``wait=true`` on the real test cluster. The apps are Hydra's
generic test apps: nothing of hpctrain is imported by them."""

from typing import Iterator

import pytest
from hydra.core.singleton import Singleton
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.version import VersionBase

# The suites' fixtures (hydra_sweep_runner, hydra_restore_singletons) come from Hydra's pytest plugin.


@pytest.fixture(autouse=True)
def hydra_version_base_unset() -> Iterator[None]:
    """The suites' apps set no version_base, so Hydra's 1.1 defaults apply (``hydra.job.chdir``: the job
    runs in its output dir, which the suites check). An in-process test that ran earlier in the same
    pytest session (``initialize(version_base="1.3")``) leaves 1.3 in Hydra's VersionBase singleton,
    which the launchers carry into the job with the other singletons: reset it for these tests."""
    saved = Singleton._instances.pop(VersionBase, None)
    yield
    if saved is not None:
        Singleton._instances[VersionBase] = saved


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
