"""Run a test's sweep bare or inside the test container (issue 27's matrix).

``container``: ``hydra.launcher.container.image`` is the sandbox image built from Singularity.def
(tests/container/build_image.py) and `apptainer` on PATH is the bubblewrap stand-in (tests/container/apptainer):
the image as `/`, no Slurm client and no munge socket inside, the image's own python, torch and hpctrain.
``contain``: the same with ``container.args=[--contain]``: no $HOME, /tmp or $PWD of the host, a minimal /dev;
the job sees only what hpctrain binds.
"""

import json
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
        return self.name in ("container", "contain")


def mode_for(name: str, tmp_path: Path) -> Mode:
    if name == "bare":
        return Mode(name)
    where = tmp_path / "container"
    where.mkdir(exist_ok=True)
    bin_dir = where / "bin" if (where / "bin" / "apptainer").exists() else standin_bin(where)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    args = [f"hydra.launcher.container.image={sandbox_image()}"]
    if name == "contain":
        args.append("hydra.launcher.container.args=[--contain]")
    return Mode(name, args, {"PATH": path, "APPTAINER_STANDIN_LOG": str(tmp_path / "apptainer.jsonl")})


def task_calls(tmp_path: Path) -> List[List[str]]:
    """The argv of each call of the stand-in that ran a job's task."""
    log = tmp_path / "apptainer.jsonl"
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()] if log.exists() else []
    return [argv for argv in calls if "submitit.core._submit" in argv]


def ran_contained(tmp_path: Path) -> bool:
    """Whether the job's tasks went through the stand-in (its log has their calls)."""
    return bool(task_calls(tmp_path))


def ran_as(tmp_path: Path, mode: Mode) -> bool:
    """Whether the job's tasks ran as ``mode`` says: bare, in the container, with --contain in every call."""
    calls = task_calls(tmp_path)
    if not mode.contained:
        return not calls
    return bool(calls) and all(("--contain" in argv) == (mode.name == "contain") for argv in calls)
