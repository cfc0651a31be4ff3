"""Run a test's sweep bare or inside the test container (issue 27's matrix).

``container``: ``hydra.launcher.container.image`` is the sandbox image built from Singularity.def
(tests/container/build_image.py) and `apptainer` on PATH is the bubblewrap stand-in (tests/container/apptainer):
the image as `/`, no Slurm client and no munge socket inside, the image's own python, torch and hpctrain.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

from container_helpers import sandbox_image, standin_bin

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
    where = tmp_path / "container"
    where.mkdir(exist_ok=True)
    bin_dir = where / "bin" if (where / "bin" / "apptainer").exists() else standin_bin(where)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    return Mode(name, [f"hydra.launcher.container.image={sandbox_image()}"],
                {"PATH": path, "APPTAINER_STANDIN_LOG": str(tmp_path / "apptainer.jsonl")})


def ran_contained(tmp_path: Path) -> bool:
    """Whether the job's tasks went through the stand-in (its log has their calls)."""
    log = tmp_path / "apptainer.jsonl"
    return log.exists() and "submitit.core._submit" in log.read_text()
