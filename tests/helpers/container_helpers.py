"""The test image (a sandbox built from Singularity.def) and the bubblewrap stand-in for `apptainer`."""

import importlib.util
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from cli_helpers import ROOT

CONTAINER_DIR = ROOT / "tests" / "container"
STANDIN = CONTAINER_DIR / "apptainer"


def _build_module():
    spec = importlib.util.spec_from_file_location("build_image", CONTAINER_DIR / "build_image.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sandbox_image() -> Path:
    """The image for this checkout: built by .ci/run before the tests; built here (minutes) if it is not."""
    return _build_module().ensure()


def standin_bin(directory: Path) -> Path:
    """A bin dir holding `apptainer` (the stand-in), to put first on PATH."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apptainer").symlink_to(STANDIN)
    return bin_dir


def apptainer(args: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(STANDIN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def lines(proc: subprocess.CompletedProcess) -> List[str]:
    return proc.stdout.splitlines()
