"""What an app tells hpctrain's launchers and search about itself: one dataclass of hooks on its task function.

hpctrain's own app (:mod:`hpctrain.app`) attaches one with :func:`attach`; the launcher, the search
sweeper and the packed runner read it with :func:`contract_of`, the one reader. A user's own Hydra app
attaches none and gets :data:`PLAIN`: no checks, its return value as the objective. No torch, no Hydra.
"""

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Optional, Tuple, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__hpctrain_app__"


@dataclass(frozen=True)
class AppContract:
    # each sweep point's config, on the login node before anything is submitted: the problems found
    # (called as ``validate(cfg, world_size=N)``, with ``plain=`` too where it takes it)
    validate: Optional[Callable[..., List[str]]] = None
    unread_keys: Optional[Callable[[Any], List[str]]] = None  # warnings: keys of the config the app never reads
    mutable_keys: Optional[FrozenSet[str]] = None  # what it applies on resume: what scheduler=pbt may explore
    preload: Tuple[str, ...] = ()  # modules a packed task imports once, before it forks its runs
    objective_metric: Optional[str] = None  # the search's default objective; None: the return value
    gpu_per_rank: bool = False  # its ranks take one GPU each (NCCL refuses a shared one)


PLAIN = AppContract()  # any other Hydra app


def attach(task_function: F, contract: AppContract) -> F:
    """Mark ``task_function`` with its app's contract; the function itself is returned."""
    setattr(task_function, _ATTRIBUTE, contract)
    return task_function


def contract_of(task_function: Any) -> AppContract:
    """The contract attached to ``task_function`` (also through ``hydra.main``'s wrapper), else :data:`PLAIN`."""
    found = getattr(task_function, _ATTRIBUTE, None)
    return found if isinstance(found, AppContract) else PLAIN

