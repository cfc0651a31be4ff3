"""The launcher's and sweepers' settings, typed: checked in the plugin shells' ``setup()``.

The plugin package registers the same defaults as plain dicts (``hydra_plugins/hpctrain_launcher/config.py``),
so that Hydra's plugin scan, which every Hydra app in the environment pays for, builds no dataclass and no
structured config; ``tests/test_plugin.py`` checks that the two agree.
Resource names carry their units, as submitit names them (timeout_min, mem_gb, signal_delay_s).
The search sweeper's settings live with the search: ``hpctrain.search.settings.SearchSweeperConf``.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

_PKG = "hydra_plugins.hpctrain_launcher.plugins"


@dataclass
class ContainerConf:
    image: Optional[str] = None  # path to an Apptainer/Singularity image (.sif); None: no container
    runtime: str = "apptainer"  # apptainer | singularity
    binds: List[str] = field(default_factory=list)  # extra SRC[:DST[:OPTS]]; sweep dir and project always
    args: List[str] = field(default_factory=list)  # extra `exec` options, e.g. [--writable-tmpfs]; not --cleanenv
    python: str = "python"  # the interpreter inside the image


@dataclass
class BaseLauncherConf:
    _target_: str = ""
    submitit_folder: str = "${hydra.sweep.dir}/.submitit"
    dry_run: bool = False  # print what would be submitted, submit nothing
    max_retries: int = 1  # a crashed run is requeued this many times before it counts as failed
    timeout_min: int = 60
    signal_delay_s: int = 90  # USR2 this long before the time limit: checkpoint and requeue
    max_num_timeout: int = 3  # requeues after time limits (preemptions do not count)
    tasks_per_node: Optional[int] = None  # default: gpus_per_node when GPUs are asked for, else 1
    gpus_per_node: Optional[int] = None
    setup: List[str] = field(default_factory=list)  # shell lines run before the job's tasks start
    env: Dict[str, str] = field(default_factory=dict)  # variables exported for the job
    python: Optional[str] = None  # interpreter on the compute node; default: this one
    runs_per_task: int = 1  # k single-rank sweep points side by side in each task (pack.py)
    workers: Optional[int] = None  # W tasks that pull the sweep's points until all are done (search/pull.py)
    gpu_memory_fraction: Optional[float] = None  # packed runs: each run's cap on its GPU's memory, (0, 1]
    container: ContainerConf = field(default_factory=ContainerConf)
    # the code every task runs, copied once per submission into the sweep dir (hpctrain/submit/snapshot.py):
    # false turns it off; `paths` adds files or directories; `max_mb` caps its size. Typed Any so that
    # both `snapshot=false` and `snapshot.paths=[...]` work; hpctrain.submit.snapshot.read_settings checks it.
    snapshot: Any = field(default_factory=lambda: {"enabled": True, "paths": [], "max_mb": 50})


@dataclass
class LocalLauncherConf(BaseLauncherConf):
    _target_: str = f"{_PKG}.LocalLauncher"
    timeout_min: int = 24 * 60
    signal_delay_s: int = 30
    max_parallel: Optional[int] = None  # default: one run per visible GPU, or one on a CPU-only machine


@dataclass
class SlurmLauncherConf(BaseLauncherConf):
    _target_: str = f"{_PKG}.SlurmLauncher"
    wait: bool = False  # block until every run ends and return their results
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    nodes: int = 1
    cpus_per_task: Optional[int] = None
    mem_gb: Optional[float] = None
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    array_parallelism: int = 256
    job_name: str = "${hydra.job.name}"
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option
    srun_args: List[str] = field(default_factory=list)


@dataclass
class SweeperConf:
    _target_: str = f"{_PKG}.HpctrainSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, str]] = None  # a sweep kept in a file: conf/sweep/*.yaml
