"""Stragglers and repeat-offender nodes as review shows them.

A run's stragglers are its latest attempt's ranks that rank 0's trainer flagged (metrics.json
``stragglers``, :mod:`hpctrain.job.straggler`): ``status``, the tab and ``hpctrain.load`` show them in one
line each (``straggler: rank 1 on n2, 1.8x``). ``report`` names each node that hung or straggled in two or
more runs or attempts of the sweep, from the record's ``hung`` and ``straggler`` events (every attempt's,
not only the latest). No torch here.
"""

from collections import defaultdict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from hpctrain.core import events
from hpctrain.core.state import EventKind, placed

REPEATS = 2  # runs or attempts a node hung or straggled in before report names it


def entries(value: Any) -> List[Dict[str, Any]]:
    """A summary's ``stragglers`` as a list of entries (``[]`` for anything else)."""
    if not isinstance(value, list):
        return []
    return [dict(e) for e in value if isinstance(e, dict) and isinstance(e.get("rank"), int)]


def describe(entry: Mapping[str, Any]) -> str:
    """``straggler: rank 1 on n2, 1.8x`` (its own work per step / the other ranks' median)."""
    factor = entry.get("factor")
    shown = f"{float(factor):.1f}x" if isinstance(factor, (int, float)) else "?x"
    return f"straggler: rank {entry.get('rank')} on {entry.get('node') or 'an unknown node'}, {shown}"


def line(stragglers: Iterable[Mapping[str, Any]]) -> str:
    """A run's stragglers in one line; "" for none."""
    return "; ".join(describe(e) for e in stragglers)


def node_incidents(runs: Iterable[Any]) -> Dict[str, List[str]]:
    """Each node that hung or straggled, with what happened there: ``#3 hung (attempt 1)`` for each run and
    attempt (a run's several ranks on one node in one attempt count once)."""
    seen: Dict[str, Set[Tuple[int, int, int]]] = defaultdict(set)
    said: Dict[str, List[str]] = defaultdict(list)
    for r in runs:
        if r.run_dir is None:
            continue
        for sub, attempt, e in placed(events.events(r.run_dir)):
            if e.kind not in (EventKind.HUNG, EventKind.STRAGGLER):
                continue
            data = e.data()
            named = data.get("nodes") if e.kind is EventKind.HUNG else [data.get("node")]
            for node in (str(n) for n in named or [] if n):
                if (r.idx, sub, attempt) in seen[node]:
                    continue
                seen[node].add((r.idx, sub, attempt))
                what = "hung" if e.kind is EventKind.HUNG else "straggled"
                said[node].append(f"#{r.idx} {what} (attempt {attempt})")
    return dict(said)


def repeat_line(runs: Iterable[Any]) -> Optional[str]:
    """One line naming the nodes that hung or straggled in REPEATS or more runs/attempts; None for none."""
    repeated = {node: what for node, what in node_incidents(runs).items() if len(what) >= REPEATS}
    if not repeated:
        return None
    named = "; ".join(f"{node}: {', '.join(what)}" for node, what in sorted(repeated.items()))
    nodes = ",".join(sorted(repeated))
    return (f"hung or straggled in {REPEATS} or more runs/attempts: {named} (hydra.launcher.exclude={nodes} "
            f"keeps a new launch off {'them' if len(repeated) > 1 else 'it'})")
