"""Every file name of a run dir, a sweep dir and a submission, as submitit's ``JobPaths``: ``RunPaths``,
``SweepPaths`` (a submission's own files: ``hpctrain.submit.submission.Files``). Nothing else spells these names.

Shared by both wings (trainer and login-node commands): no torch here.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

from hpctrain.core.atomic import read_json

PathLike = Union[str, Path]

METRICS = "metrics.json"
METRICS_LOCK = "metrics.lock"  # in HPCTRAIN_DIR: the sidecar every metrics.json writer locks
HPCTRAIN_DIR = ".hpctrain"  # hpctrain's own files, in a run dir and in a sweep dir
PACKED_LOG = os.path.join(HPCTRAIN_DIR, "task.log")  # a packed run's own output, under its run dir
PACKED_CANCELLED = "cancelled (its record says so)"  # the task's note in that log when it stopped the run
RECORD_DIR = os.path.join(HPCTRAIN_DIR, "record")  # the run's event log (hpctrain.core.events)
TB_DIR = "tb"
CKPT_DIR = "checkpoints"
STACKS_DIR = "stacks"  # a hung attempt's stack dumps, one file per rank (hpctrain.job.watchdog)
CKPT = Path(CKPT_DIR) / "last.pt"
PREVIOUS_CKPT = "previous.pt"
HYDRA_DIR = ".hydra"
SWEEP_MANIFEST = "sweep.json"  # written by the launcher into the sweep dir
SUBMITIT_DIR = ".submitit"
HOST_DIR = os.path.join(HPCTRAIN_DIR, "host")  # in the sweep dir: per Slurm job, its host side's requests
MULTIRUN_YAML = "multirun.yaml"  # Hydra's own record of a multirun, in the sweep dir
SUBMISSION = "submission-"  # a submission's files under the sweep's .hpctrain: submission-N, .pkl, .runs.json


@dataclass(frozen=True)
class RunPaths:
    """The files of one run dir."""

    root: Path

    def __init__(self, root: PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def metrics_lock(self) -> Path:
        """The sidecar every metrics.json writer locks (hpctrain.core.summary)."""
        return self.root / HPCTRAIN_DIR / METRICS_LOCK

    @property
    def tb(self) -> Path:
        return self.root / TB_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CKPT_DIR

    @property
    def hydra(self) -> Path:
        return self.root / HYDRA_DIR

    @property
    def hydra_config(self) -> Path:
        return self.hydra / "config.yaml"

    @property
    def hydra_yaml(self) -> Path:
        return self.hydra / "hydra.yaml"

    @property
    def overrides_yaml(self) -> Path:
        return self.hydra / "overrides.yaml"

    @property
    def record(self) -> Path:
        """The run's event log: one file per event (hpctrain.core.events)."""
        return self.root / RECORD_DIR

    @property
    def packed_log(self) -> Path:
        return self.root / PACKED_LOG

    @property
    def hardware(self) -> Path:
        """Each rank's hardware at its attempt's start, ``rank-<N>.json`` (rank 0's is in its ``started``)."""
        return self.root / HPCTRAIN_DIR / "hardware"


@dataclass(frozen=True)
class SweepPaths:
    """The files of a sweep dir."""

    root: Path

    def __init__(self, root: PathLike) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def manifest(self) -> Path:
        return self.root / SWEEP_MANIFEST

    @property
    def manifest_lock(self) -> Path:
        """The sidecar every sweep.json writer locks (hpctrain.core.manifest)."""
        return self.hpctrain / "sweep.lock"

    @property
    def multirun_yaml(self) -> Path:
        return self.root / MULTIRUN_YAML

    @property
    def submitit(self) -> Path:
        return self.root / SUBMITIT_DIR

    @property
    def hpctrain(self) -> Path:
        return self.root / HPCTRAIN_DIR

    @property
    def submit_lock(self) -> Path:
        """Held by the one launcher submitting into this sweep dir (hpctrain.submit.lock)."""
        return self.hpctrain / "submit.lock"

    @property
    def launch_log(self) -> Path:
        """The local launcher's own output when ``hpctrain.launch()`` starts it."""
        return self.hpctrain / "launch.log"

    def submission(self, number: int) -> Path:
        """Submission ``number``'s base path (``submission-N``: its code dir; ``.pkl``, ``.runs.json`` beside it)."""
        return self.hpctrain / f"{SUBMISSION}{number}"

    def submission_numbers(self) -> "list[int]":
        """The numbers every earlier submission's files hold, finished or not."""
        pattern = re.compile(rf"{re.escape(SUBMISSION)}(\d+)(\.|$)")
        try:
            names = os.listdir(self.hpctrain)
        except OSError:
            return []
        return sorted({int(m.group(1)) for n in names if (m := pattern.match(n))})

    def worker_placeholder(self, index: int) -> Path:
        """A search worker's placeholder run dir (its record, when it died before running a trial)."""
        return self.workers / f"worker-{index}"

    @property
    def study_journal(self) -> Path:
        """A search sweep's Optuna journal."""
        return self.hpctrain / "study.journal"

    @property
    def trials(self) -> Path:
        """A search sweep's leases (``<number>.json``) and heartbeats; also the name of its trials lock."""
        return self.hpctrain / "trials"

    @property
    def workers(self) -> Path:
        """A search sweep's worker announcements (``<job id>.json``) and placeholder run dirs."""
        return self.hpctrain / "workers"

    @property
    def tensorboard_links(self) -> Path:
        return self.hpctrain / "tensorboard"


def read_metrics(run_dir: PathLike) -> Optional[Dict[str, Any]]:
    return read_json(RunPaths(run_dir).metrics)

