"""A sweep's tasks cut into job arrays the cluster accepts.

Slurm's ``MaxArraySize`` caps the array INDEX (the largest is ``MaxArraySize - 1``) and
``SchedulerParameters=max_array_tasks`` the tasks of one array; both are read by
:func:`hpctrain.slurm.query.array_limits` (Slurm's default 1001 when unreadable). Each array is indexed
from 0; its ``offset`` says where its tasks start in the sweep's task list.
"""

from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class Chunk:
    offset: int  # the first task's position in the sweep's task list
    size: int  # tasks in this array: indices 0..size-1


def split(n_tasks: int, per_array: int) -> List[Chunk]:
    """``n_tasks`` tasks as arrays of at most ``per_array`` tasks each, in order."""
    per_array = max(1, per_array)
    return [Chunk(o, min(per_array, n_tasks - o)) for o in range(0, n_tasks, per_array)]
