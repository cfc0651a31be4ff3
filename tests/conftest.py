"""Fixtures and collection rules; the helpers tests import live in tests/helpers/ (cli_helpers.py, ...)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path


import pytest

# One OpenMP thread per process, here (set before torch is imported) and in every run the tests start (the
# variable is inherited, by Slurm jobs too): with more threads than free cores, OpenMP's spinning threads made
# a 100-step CPU run take 13 s instead of 0.6 s on a loaded 2-core machine. Every process gets the same count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers"
sys.path.insert(0, str(HELPERS))  # the helpers are importable by tests too


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The real test cluster (slurm/test-cluster.sh start, run by .ci/run). Fails, never skips, without it."""
    if shutil.which("sinfo") is None:
        pytest.fail("no Slurm here: start the test cluster with `bash slurm/test-cluster.sh start`")
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    states = {line.split()[-1].rstrip("*~#") for line in out.stdout.splitlines() if line.strip()}
    if out.returncode != 0 or not states & {"idle", "mix", "alloc", "comp"}:
        pytest.fail(f"the Slurm test cluster is not up: {out.stdout} {out.stderr}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Every test that uses the cluster carries the `slurm` marker, so `-m "not slurm"` runs without one.

    With pytest-xdist (`-n 2 --dist loadgroup`, as .ci/run runs): the cluster tests run one after another
    on one worker (they share the cluster's 4 CPU slots and some wait for their jobs to start at once),
    and each module's other tests on one worker (its module fixtures are built once)."""
    unmarked = [item.nodeid for item in items
                if "slurm_cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slurm") is None]
    if unmarked:
        raise pytest.UsageError("tests using the slurm_cluster fixture without @pytest.mark.slurm: "
                                + ", ".join(unmarked))
    for item in items:
        group = "slurm" if item.get_closest_marker("slurm") else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _cluster_tests_first_for_the_cpu(request) -> None:
    """Under pytest-xdist the cluster tests are the longest line of work: while one runs, the other
    worker's tests (and the processes they start) run at a lower CPU priority (nice 10), so the cluster's
    jobs (started by slurmd, at the normal priority) are not slowed by them. Only root may lower it back."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    want = 0 if request.node.get_closest_marker("slurm") else 10
    try:
        os.setpriority(os.PRIO_PROCESS, 0, want)
    except PermissionError:
        pass  # not root: a worker that ran an other test keeps nice 10


def pytest_configure(config) -> None:
    """`--dist loadgroup` needs pytest<9 with pytest-xdist 3 (it tags each test id with its group, which
    pytest 9's test ids no longer take): without the groups the cluster tests would run two at a time."""
    if getattr(config.option, "dist", "no") == "loadgroup" and int(pytest.__version__.split(".")[0]) >= 9:
        import xdist

        if int(xdist.__version__.split(".")[0]) < 4:
            raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} does not "
                                    f"group tests (--dist loadgroup): install pytest<9 (pyproject.toml's test extra)")
