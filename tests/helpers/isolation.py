"""Run a test's sweep bare or inside a container that hides Slurm from the job (issue 27's matrix).

``container``: ``hydra.launcher.container.image`` set, and `apptainer` on PATH is tests/helpers/isolated_apptainer
(bubblewrap: no Slurm client, no munge socket inside; a stand-in until the test image from Singularity.def
exists). The interpreter "inside the image" is this venv's python, found on PATH by the stand-in.
"""

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from cli_helpers import HELPERS

MODES = ["bare", "container"]


@dataclass
class Mode:
    name: str
    args: List[str] = field(default_factory=list)  # launcher overrides
    env: Dict[str, str] = field(default_factory=dict)  # for run_hpctrain

    @property
    def contained(self) -> bool:
        return self.name == "container"


def mode_for(name: str, tmp_path: Path) -> Mode:
    if name == "bare":
        return Mode(name)
    bin_dir = tmp_path / "container-bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "apptainer").exists():
        (bin_dir / "apptainer").symlink_to(HELPERS / "isolated_apptainer")
    image = tmp_path / "img.sif"
    image.touch()
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return Mode(name, [f"hydra.launcher.container.image={image}"],
                {"PATH": path, "FAKE_APPTAINER_LOG": str(tmp_path / "apptainer.jsonl")})


def ran_contained(tmp_path: Path) -> bool:
    """Whether the job's tasks went through the stand-in (its log has their calls)."""
    log = tmp_path / "apptainer.jsonl"
    return log.exists() and "submitit.core._submit" in log.read_text()
