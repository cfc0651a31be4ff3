"""hpctrain's launchers and sweepers for Hydra: ``hydra/launcher=local|slurm``, ``hydra/sweeper=hpctrain|search``.

Hydra runs this module at the start of every app in the environment (its plugin scan), so the nodes are
plain dicts: no dataclass, no structured config, nothing of hpctrain imported. Their types live in
``hpctrain.submit.settings`` (the search's in ``hpctrain.search.settings``; the shells in ``plugins.py``
check them in ``setup()``); a test keeps the two equal. Comments on each key: see those modules.
"""

from hydra.core.config_store import ConfigStore

SWEEPER = {
    "_target_": "hydra_plugins.hpctrain_launcher.plugins.HpctrainSweeper",
    "max_batch_size": None,
    "params": None,
}

SEARCH_SWEEPER = {
    "_target_": "hydra_plugins.hpctrain_launcher.plugins.SearchSweeper",
    "n_trials": 20,
    "n_workers": 4,
    "sampler": "tpe",
    "pruner": "median",
    "startup_trials": 5,
    "seed": None,
    "grace_s": 120,
    "heartbeat_s": 10.0,
    "params": None,
    "scheduler": "none",
    "min_steps": None,
    "eta": 3,
    "population": 8,
    "interval": None,
    "quantile": 0.25,
    "resample_p": 0.25,
}

_LAUNCHER = {  # both launchers' keys (hpctrain.submit.settings.BaseLauncherConf)
    "submitit_folder": "${hydra.sweep.dir}/.submitit",
    "dry_run": False,
    "max_retries": 1,
    "max_num_timeout": 3,
    "tasks_per_node": None,
    "gpus_per_node": None,
    "setup": [],
    "env": {},
    "python": None,
    "runs_per_task": 1,
    "workers": None,
    "gpu_memory_fraction": None,
    "container": {"image": None, "runtime": "apptainer", "binds": [], "args": [], "python": "python"},
    "snapshot": {"enabled": True, "paths": [], "max_mb": 50},
}

LOCAL_LAUNCHER = {
    **_LAUNCHER,
    "_target_": "hydra_plugins.hpctrain_launcher.plugins.LocalLauncher",
    "timeout_min": 1440,
    "signal_delay_s": 30,
    "max_parallel": None,
}

SLURM_LAUNCHER = {
    **_LAUNCHER,
    "_target_": "hydra_plugins.hpctrain_launcher.plugins.SlurmLauncher",
    "timeout_min": 60,
    "signal_delay_s": 90,
    "wait": False,
    "partition": None,
    "account": None,
    "qos": None,
    "nodes": 1,
    "cpus_per_task": None,
    "mem_gb": None,
    "constraint": None,
    "exclude": None,
    "array_parallelism": 256,
    "job_name": "${hydra.job.name}",
    "additional_parameters": {},
    "srun_args": [],
}

for _group, _name, _node in (
    ("hydra/sweeper", "hpctrain", SWEEPER),
    ("hydra/sweeper", "search", SEARCH_SWEEPER),
    ("hydra/launcher", "local", LOCAL_LAUNCHER),
    ("hydra/launcher", "slurm", SLURM_LAUNCHER),
):
    ConfigStore.instance().store(group=_group, name=_name, node=_node, provider="hpctrain")
