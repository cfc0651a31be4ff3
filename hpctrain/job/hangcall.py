"""One decision for a hang of a run over several nodes: the nodes' watchdogs agree through the run dir.

Each node's watchdog (:mod:`hpctrain.job.watchdog`) sees only its own ranks. A rank blocked in its own code
stalls every other rank in the next collective, on every node, within a poll of each other: alone, each
watchdog would call the hang, the rank-0 node's naming its own rank (which only waits in the collective), and
each would end the step. With more than one node instead:

- the first watchdog that sees a stall *calls* the hang: it creates ``call`` in the attempt's hang dir
  (``O_EXCL``: one caller; a watchdog that sees a stall a moment later finds it called and follows);
- every watchdog, the caller and the others (they look for ``call`` once a poll), dumps its own ranks' stacks
  and writes its node's report (``<node>.json``: each rank's step, phase, stall, frame);
- the caller waits for every node's report (at most :data:`REPORT_WAIT_S`), names the culprit from all of them
  (:func:`named`), records the one ``hung`` event and writes ``decided``;
- each watchdog then ends its own ranks; one that sees no ``decided`` within :data:`DECIDE_WAIT_S` of its
  report (its caller's node died) ends them too: the attempt then ends failed, and is retried as such.

The files live in ``<run_dir>/.hpctrain/hang/<job>-r<restart>/``: the run dir is what every node shares.
No torch here.
"""

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional

from hpctrain.core.atomic import write_json_atomic
from hpctrain.core.paths import HPCTRAIN_DIR

HANG_DIR = os.path.join(HPCTRAIN_DIR, "hang")
REPORT_WAIT_S = 15.0  # a follower notices the call within a poll (1 s) and dumps within DUMP_WAIT_S (3 s)
DECIDE_WAIT_S = 30.0
CALL, DECIDED = "call", "decided"


@dataclass(frozen=True)
class RankReport:
    """One rank as its node's watchdog saw it when the hang was called."""

    rank: int
    node: str
    step: int
    phase: str
    stalled: bool  # past its own allowance on its node's watchdog
    own: bool  # its main thread waits in its own code, not in torch: a cause, not the fallout of a peer
    frame: str  # where it waits (``block_forever (user_models.py:272)``), "" without a dump
    quiet_s: float  # since its last step or phase change
    allowance_s: float
    stack: str = ""  # its stack file in the run dir


def named(ranks: List[RankReport]) -> "tuple[List[RankReport], bool]":
    """The ranks a hang is blamed on, and whether that is only the fallout: the ranks waiting in their own
    code (a collective's peer waits in torch), else every stalled rank (all wait in torch: a deadlock, a dead
    link, a peer that is gone); by rank."""
    own = sorted((r for r in ranks if r.own), key=lambda r: r.rank)
    if own:
        return own, False
    stalled = sorted((r for r in ranks if r.stalled), key=lambda r: r.rank)
    return (stalled or sorted(ranks, key=lambda r: r.rank)), True


class Exchange:
    """The hang dir of one attempt of a run, as one node's watchdog uses it."""

    def __init__(self, run_dir: str, attempt: str, node: str, nodes: int) -> None:
        self.dir = Path(run_dir) / HANG_DIR / attempt
        self.node, self.nodes = node, nodes

    def called(self) -> bool:
        """Whether another node's watchdog called a hang (one stat of the shared file system a poll)."""
        return (self.dir / CALL).exists()

    def call(self) -> bool:
        """Call the hang; False when another node's watchdog called it first (this one follows)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / CALL, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError:
            return True  # no shared dir to agree in: this node decides for itself, as on one node
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"node": self.node, "time": time.time()}))
        return True

    def report(self, ranks: List[RankReport]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.dir / f"{self.node}.json", [asdict(r) for r in ranks])
        except OSError:
            pass  # the caller decides without it (at REPORT_WAIT_S)

    def _files(self) -> List[Path]:
        try:
            return sorted(self.dir.glob("*.json"))
        except OSError:
            return []

    def reports(self) -> List[RankReport]:
        out: List[RankReport] = []
        for path in self._files():
            try:
                out += [RankReport(**r) for r in json.loads(path.read_text())]
            except (OSError, ValueError, TypeError):
                continue  # a report torn or of another version: decided without it
        return out

    def gather(self, alive: Callable[[], bool], wait_s: float = REPORT_WAIT_S) -> List[RankReport]:
        """Every node's ranks, once each node reported (at most ``wait_s``, or until this watchdog's own
        ranks are gone)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive():
            if len(self._files()) >= self.nodes:  # a node with no rank watched yet reports none
                break
            time.sleep(0.1)
        return self.reports()

    def decided(self, line: str) -> None:
        try:
            write_json_atomic(self.dir / DECIDED, {"node": self.node, "line": line, "time": time.time()})
        except OSError:
            pass  # the followers end their ranks at DECIDE_WAIT_S

    def wait_decided(self, alive: Callable[[], bool], wait_s: float = DECIDE_WAIT_S) -> bool:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive():
            if (self.dir / DECIDED).exists():
                return True
            time.sleep(0.1)
        return (self.dir / DECIDED).exists()

    def caller(self) -> Optional[str]:
        try:
            return str(json.loads((self.dir / CALL).read_text()).get("node"))
        except (OSError, ValueError, AttributeError):
            return None
