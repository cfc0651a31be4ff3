"""The Apptainer/Singularity command line that wraps every task of a job.

submitit puts its ``python`` parameter in front of ``-u -m submitit.core._submit FOLDER`` on the srun
line; this module builds that prefix: ``apptainer exec [--nv] --bind ... IMAGE python``. Every piece
is shell-quoted, so a bind path or an argument with spaces or metacharacters stays data.
"""

import os
import shlex
from pathlib import Path
from typing import List, Optional, Sequence

RUNTIMES = ("apptainer", "singularity")


def container_command(
    image: str,
    runtime: str = "apptainer",
    gpus: bool = False,
    binds: Sequence[str] = (),
    args: Sequence[str] = (),
    python: str = "python",
) -> str:
    argv: List[str] = [runtime, "exec"]
    if gpus:
        argv.append("--nv")  # NVIDIA driver libraries and devices inside the container
    for bind in dict.fromkeys(binds):  # keep order, drop duplicates
        argv += ["--bind", bind]
    argv += list(args)
    argv += [str(image), python]
    return shlex.join(argv)


# the node's shared memory, one for all the node's tasks: their heartbeats and the hang watchdog that reads them
# (hpctrain.job.heartbeat), NCCL's shared-memory transport. `--contain` and `mount dev = minimal` give each
# `apptainer exec` a /dev/shm of its own (apptainer/apptainer#3001)
NODE_SHM = "/dev/shm"


def default_binds(sweep_dir: Path, project_dir: Path, submitit_folder: Optional[Path] = None) -> List[str]:
    """Shared storage the job must see: the sweep dir (runs write there), the project, and submitit's
    folder (the job's pickles and logs) when it lies outside the sweep dir; the node's /dev/shm."""
    binds = [Path(sweep_dir).resolve(), Path(project_dir).resolve()]
    if submitit_folder is not None:
        folder = Path(submitit_folder).resolve()
        if binds[0] not in folder.parents and folder != binds[0]:
            binds.append(folder)  # submitit creates it when it submits, before the job starts
    return [str(b) for b in binds] + [NODE_SHM]


def image_problem(path: Path) -> Optional[str]:
    """What Apptainer runs: an image file (.sif, or the older squashfs/ext3 forms) or a sandbox directory
    (`apptainer build --sandbox DIR ...`, recognised by the .singularity.d/ every build writes in it)."""
    if not path.exists():
        return "file not found"
    if path.is_dir():
        if not (path / ".singularity.d").is_dir():
            return "not a readable file or sandbox directory (a directory without .singularity.d in it)"
        if not os.access(path, os.R_OK | os.X_OK):
            return "not a readable file or sandbox directory (a sandbox this user cannot read)"
        return None
    if not path.is_file() or not os.access(path, os.R_OK):
        return "not a readable file or sandbox directory"
    return None


def check_container(image: Optional[str], runtime: str, binds: Sequence[str]) -> List[str]:
    """Login-node checks: what would fail on the compute node, said before anything is submitted."""
    problems: List[str] = []
    if not image:
        return problems
    if runtime not in RUNTIMES:
        problems.append(f"hydra.launcher.container.runtime={runtime!r}: expected one of {', '.join(RUNTIMES)}")
    problem = image_problem(Path(image))
    if problem:
        problems.append(f"hydra.launcher.container.image={image!r}: {problem}")
    for bind in binds:
        src = bind.split(":", 1)[0]
        if not Path(src).exists():
            problems.append(f"hydra.launcher.container.binds: {bind!r}: source path {src!r} does not exist")
    return problems


# exec options that drop the host's environment: the job's tasks need Slurm's per-task SLURM_* variables (submitit
# reads them to know its rank and job), which no APPTAINERENV_ line in the batch script can pass on
CLEANENV = ("--cleanenv", "-e", "--containall", "-C")


def check_args(args: Sequence[str]) -> List[str]:
    """Refused up front: ``container.args`` that would make every task fail at its start."""
    dropped = [a for a in args if a.split("=", 1)[0] in CLEANENV]
    if not dropped:
        return []
    return [f"hydra.launcher.container.args: {', '.join(dropped)} drops the job's environment; its tasks need "
            f"Slurm's SLURM_* variables (set per task by srun, so they cannot be passed explicitly); leave it out "
            f"(variables for the job go in hydra.launcher.env: the image sees the job's environment)"]
