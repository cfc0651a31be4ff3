"""A search's settings: the sweeper's config (``hydra/sweeper=search``), the one place their defaults live,
and what every worker is handed (:class:`Settings`, read once from that config on the login node).

The plugin package registers the same defaults as a plain dict (``hydra_plugins/hpctrain_launcher/config.py``:
Hydra's plugin scan builds no dataclass); ``tests/test_plugin.py`` keeps the two equal. No optuna here.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from hpctrain.core.state import Direction
from hpctrain.search.space import Space

_PKG = "hydra_plugins.hpctrain_launcher.plugins"
MIN_TIME_LEFT_S = 180.0  # a worker closer than this to its time limit starts no new trial
SCHEDULED = ("asha", "hyperband")  # the schedulers that pause trials at rungs (the first rung: min_steps)


@dataclass
class SearchSweeperConf:
    _target_: str = f"{_PKG}.SearchSweeper"
    n_trials: int = 20  # trials in the study in total (a rerun continues up to this)
    n_workers: int = 4  # worker tasks of the job array; on the local launcher: max_parallel
    sampler: str = "tpe"  # tpe | random | grid | cmaes | gp
    pruner: str = "median"  # median | asha | none: stop bad trials at an eval step
    startup_trials: int = 5  # the median pruner prunes nothing before this many trials have finished
    seed: Optional[int] = None  # the samplers' seed (each worker's own: hpctrain.search.study.worker_seed)
    grace_s: int = 120  # a running trial whose worker is unknown and silent this long is taken over
    heartbeat_s: float = 10.0
    params: Optional[Dict[str, str]] = None  # the space kept in a file (+sweep=NAME): key -> interval(...)
    # schedulers (hpctrain.search.units): trials paused at a unit's end and resumed from their checkpoints
    scheduler: str = "none"  # none (the pruner decides) | asha (promotion) | hyperband | pbt
    min_steps: Optional[int] = None  # asha/hyperband: the first rung; default: the app's eval_every
    eta: int = 3  # asha/hyperband: rungs at min_steps * eta^k; the top 1/eta of a rung is promoted
    population: int = 8  # pbt: trials trained side by side
    interval: Optional[int] = None  # pbt: steps between exploit/explore decisions; default: eval_every
    quantile: float = 0.25  # pbt: the bottom quantile copies a top-quantile trial
    resample_p: float = 0.25  # pbt: chance that explore resamples a value instead of perturbing it


_CONF = SearchSweeperConf()  # the defaults below are the config's: written once, above


@dataclass
class Settings:
    """What the sweeper decided on the login node; pickled into every worker."""

    space: Space
    n_trials: int = _CONF.n_trials
    n_workers: int = _CONF.n_workers
    sampler: str = _CONF.sampler
    pruner: str = _CONF.pruner
    seed: Optional[int] = _CONF.seed
    grace_s: float = _CONF.grace_s  # a trial whose heartbeat is older than this (and whose job is unknown) is adopted
    heartbeat_s: float = _CONF.heartbeat_s
    startup_trials: int = _CONF.startup_trials
    scheduler: str = _CONF.scheduler  # none (a trial is one unit to max_steps) | asha | hyperband | pbt
    min_steps: Optional[int] = _CONF.min_steps
    eta: int = _CONF.eta
    population: int = _CONF.population
    interval: Optional[int] = _CONF.interval
    quantile: float = _CONF.quantile
    resample_p: float = _CONF.resample_p
    # from the app and the launcher, read on the login node (from_conf)
    metric: Optional[str] = None  # the objective's metric, from the app's config; None: the task function's return value
    direction: str = Direction.MIN.optuna  # Optuna's spelling
    max_adoptions: int = 2  # a trial whose worker died this many times ends failed (the launcher's max_retries + 1)
    max_steps: Optional[int] = None  # the app's max_steps (the last rung), with a scheduler
    eval_every: Optional[int] = None  # the app's eval_every, with a scheduler
    first_eval_step: Optional[int] = None  # the app's first eval: the median pruner leaves it alone
    min_time_left_s: float = MIN_TIME_LEFT_S

    @classmethod
    def from_conf(cls, conf: SearchSweeperConf, space: Space, *, metric: Optional[str], direction: str,
                  n_workers: int, max_retries: int, max_steps: Any = None, eval_every: Any = None) -> "Settings":
        """The settings of a search, from its sweeper config and what the login node read of the app
        (``max_steps``, ``eval_every``: whatever its config holds) and the launcher (workers, retries)."""
        every = eval_every if isinstance(eval_every, int) and not isinstance(eval_every, bool) and eval_every > 0 \
            else None
        scheduled = conf.scheduler != "none" and isinstance(max_steps, int)
        n_trials = conf.n_trials if isinstance(conf.n_trials, int) and conf.n_trials > 0 else 1
        return cls(
            space=space, n_trials=n_trials, n_workers=max(1, min(n_workers, n_trials)), sampler=str(conf.sampler),
            pruner="none" if scheduled else str(conf.pruner),  # with a scheduler, it decides which trials go on
            seed=conf.seed, grace_s=conf.grace_s, heartbeat_s=float(conf.heartbeat_s),
            startup_trials=max(0, int(conf.startup_trials)), scheduler=str(conf.scheduler),
            min_steps=conf.min_steps or (every if scheduled and conf.scheduler in SCHEDULED else None),
            eta=conf.eta, population=conf.population, interval=conf.interval, quantile=float(conf.quantile),
            resample_p=float(conf.resample_p), metric=metric, direction=direction,
            max_adoptions=max(1, max_retries + 1), max_steps=max_steps if scheduled else None,
            eval_every=every if scheduled else None, first_eval_step=every)
