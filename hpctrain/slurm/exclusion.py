"""Which nodes a hung run's requeue keeps off, so that the requeued job can still run (issue 30).

A hang's retry avoids the node(s) it hung on (the job's ``ExcNodeList``), but a job excluded from more nodes
than its partition can spare never starts again: Slurm keeps it pending (``BadConstraints``, seen on the test
cluster for a 2-node job on its 2 nodes) and nothing says so. Before the exclusion, the partition's usable
nodes are asked (``sinfo`` of the job's partition, through the host side: :mod:`hpctrain.slurm.host`); a hung
node is excluded only while the usable nodes left (less those excluded before) still hold the job's node
count. When they cannot be known (the host side or ``sinfo`` does not answer), no node is excluded: a retry on
the same node may hang again and cost one more attempt, a job that cannot start costs its whole queue life
(docs/decisions.md). Exclusions the job had before (the user's ``exclude``, earlier retries') stay. No torch here.
"""

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

from hpctrain.slurm import host
from hpctrain.slurm.parse import expand_nodelist, parse_fields

# sinfo's long node states (%T) where the scheduler can start a job, less the flags after them
USABLE = frozenset({"idle", "allocated", "mixed", "completing", "planned"})


@dataclass(frozen=True)
class Exclusion:
    exclude: List[str]  # the job's ExcNodeList to set: the nodes excluded before, then the hung ones avoided
    avoided: List[str]  # the hung nodes in it
    kept: List[str] = field(default_factory=list)  # the hung nodes the retry may run on again
    note: str = ""  # one line, when some are kept: why


def usable(state: str) -> bool:
    """A node state as ``sinfo -o %T`` prints it (``idle``, ``mixed~``, ``down*``, ``drained``) where a job
    can start: not responding (``*``) or in a maintenance reservation (``$``) is not."""
    state = state.strip().lower()
    if not state or state.endswith(("*", "$")):
        return False
    return state.rstrip("~#!%@^-+") in USABLE


def node_states(sinfo: str) -> Dict[str, str]:
    """``sinfo -h -N -o '%N|%T'`` -> node: state."""
    out: Dict[str, str] = {}
    for line in sinfo.splitlines():
        name, sep, state = line.strip().partition("|")
        if sep and name:
            out.setdefault(name, state)
    return out


def plan(hung: Iterable[str], before: List[str], partition: str, states: Optional[Dict[str, str]],
         needed: Optional[int], unknown: str = "") -> Exclusion:
    """The exclusion: ``hung`` nodes (in order) added to ``before`` while the partition's usable nodes left
    hold ``needed``; ``states`` or ``needed`` None (unknown, ``unknown`` says why): none added."""
    new = [n for n in dict.fromkeys(hung) if n not in before]
    if not new:
        return Exclusion(list(before), [])
    if states is None or needed is None:
        return Exclusion(list(before), [], new, f"not avoiding {','.join(new)}: {unknown}")
    up = [n for n, state in states.items() if usable(state)]
    left = {n for n in up if n not in before}
    avoided: List[str] = []
    kept: List[str] = []
    for node in new:
        if node not in left:
            avoided.append(node)  # not usable (or not in the partition) anyway: excluding it costs nothing
        elif len(left) > needed:
            left.discard(node)
            avoided.append(node)
        else:
            kept.append(node)
    if not kept:
        return Exclusion(list(before) + avoided, avoided)
    already = len(up) - len({n for n in up if n not in before})
    note = (f"not avoiding {','.join(kept)}: partition {partition} has {len(up)} usable node{'s' if len(up) != 1 else ''}"
            f"{f' ({already} excluded already)' if already else ''}, the job needs {needed}")
    return Exclusion(list(before) + avoided, avoided, kept, note)


def decide(hung: List[str]) -> Exclusion:
    """:func:`plan` for this job, asked on the host: its partition, node count and excluded nodes (``scontrol
    show job``), the partition's node states (``sinfo``)."""
    shown = host.show_job()
    lines = [ln for ln in (shown.stdout or "").splitlines() if ln.strip()]
    fields = parse_fields(lines[0]) if lines else {}
    before = [n for n in expand_nodelist(fields.get("ExcNodeList", "")) if n and n != "(null)"]
    partition = fields.get("Partition", "")
    count = fields.get("NumNodes", "").split("-", 1)[0]
    if not partition or not count.isdigit():
        why = shown.error if shown.stdout is None else "no Partition or NumNodes in its scontrol show job"
        return plan(hung, before, partition, None, None, f"the job's partition and node count are unknown ({why})")
    nodes = host.partition_nodes()
    if nodes.stdout is None or not node_states(nodes.stdout):
        why = nodes.error if nodes.stdout is None else "no nodes listed"
        return plan(hung, before, partition, None, int(count),
                    f"the usable nodes of partition {partition} are unknown (sinfo: {why})")
    return plan(hung, before, partition, node_states(nodes.stdout), int(count))
