"""Slurm's output read as production clusters print it: pure functions, no subprocess.


- :func:`parse_gres` ``"gpu:a100:4(S:0-1),shard:h100:32(S:0-1)"`` -> ``[Gres("gpu", "a100", 4, "0-1"), ...]``;
  :func:`gpu_count` sums the ``gpu`` entries (``shard``/``mps`` are not GPUs).
- :func:`expand_nodelist` ``"gpu[001-016],gpu[201-204]"`` -> 20 names, in Python (no ``scontrol show hostnames``).
- :func:`time_limit_minutes` every Slurm time-limit form; ``None`` for ``UNLIMITED``/``INFINITE``.
- :func:`parse_config` / :func:`array_limits` ``MaxArraySize`` and ``max_array_tasks`` (1001 when unreadable).
- :func:`expand_array_ids` / :func:`split_job_id` squeue's ``"14_[1-3,7%2]"`` and ``"14_3"`` forms.
"""


import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

from hpctrain.core.state import State

DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize


PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})


# sacct's final states -> the run's; the one table (as TorchX's SLURM_STATES)
SACCT_FINAL: Mapping[str, State] = MappingProxyType({
    "COMPLETED": State.COMPLETED, "FAILED": State.FAILED, "NODE_FAIL": State.FAILED, "OUT_OF_MEMORY": State.FAILED,
    "BOOT_FAIL": State.FAILED, "DEADLINE": State.TIMEOUT, "TIMEOUT": State.TIMEOUT, "CANCELLED": State.CANCELLED,
    "PREEMPTED": State.CANCELLED, "REVOKED": State.CANCELLED})


def split_job_id(job_id: str) -> Tuple[str, Optional[str]]:
    """``"123_4"`` -> ``("123", "4")``; ``"123"`` -> ``("123", None)``."""
    base, sep, task = str(job_id).partition("_")
    return base, (task if sep else None)


def job_order(job_id: str) -> Tuple[Tuple[int, str], ...]:
    """A sort key that orders job ids as numbers (``99`` before ``101``, ``7_2`` before ``7_10``)."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in str(job_id).split("_"))


def array_ids(job_ids: Iterable[Optional[str]]) -> List[str]:
    """The distinct job (array) ids of a list of job or array-task ids, in number order."""
    return sorted({split_job_id(j)[0] for j in job_ids if j}, key=job_order)


def expand_array_ids(job_id: str) -> List[str]:
    """``"14_[1-3,7%2]"`` -> ``["14_1", "14_2", "14_3", "14_7"]``; anything else unchanged."""
    m = re.fullmatch(r"(\d+)_\[([^\]]+)\]", job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


QueueState = Dict[str, Tuple[str, str]]  # job id (array tasks one by one) -> (STATE, reason)


def in_queue(queue: QueueState, job_id: str) -> bool:
    return job_id in queue or split_job_id(job_id)[0] in queue


@dataclass(frozen=True)
class Gres:
    name: str  # gpu, shard, mps, ...
    type: Optional[str]  # a100, 1g.10gb (MIG), None when untyped
    count: int
    sockets: Optional[str] = None  # "0-1" from "(S:0-1)"


_GRES = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>\d+)[KMG]?(?:\((?P<extra>[^)]*)\))?$")


def _split_outside(text: str, brackets: str) -> List[str]:
    """Split on commas outside ``brackets`` (``"()"``: ``gpu:4(S:0,1),shard:8``; ``"[]"``: ``n[1-3,7],m1``)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == brackets[0]
        depth -= ch == brackets[1]
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def parse_gres(text: str) -> List[Gres]:
    """A node's ``Gres=`` value; ``(null)``/empty -> ``[]``; an entry that does not parse is skipped."""
    text = (text or "").strip()
    if text in ("", "(null)", "N/A"):
        return []
    out = []
    for entry in _split_outside(text, "()"):
        entry = entry.strip()
        m = _GRES.match(entry)
        if m:
            sockets = None
            if m.group("extra") and m.group("extra").startswith("S:"):
                sockets = m.group("extra")[2:]
            out.append(Gres(m.group("name"), m.group("type"), int(m.group("count")), sockets))
        elif re.fullmatch(r"[A-Za-z_]+(:[^:()]+)?", entry):  # "gpu" alone: one
            name, _, typ = entry.partition(":")
            out.append(Gres(name, typ or None, 1))
    return out


def gpu_count(gres: str) -> int:
    return sum(g.count for g in parse_gres(gres) if g.name == "gpu")


def expand_nodelist(text: str) -> List[str]:
    """``"gpu[001-016],gpu[201-204]"``, ``"n[1-3,7]"``, ``"a,b"`` -> host names (zero padding kept)."""
    text = (text or "").strip()
    if text in ("", "(null)"):
        return []
    out: List[str] = []
    for item in (p for p in _split_outside(text, "[]") if p):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, rest = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out += [prefix + str(i).zfill(width) + tail for tail in (expand_nodelist(rest) or [""])]
    return out


def time_limit_minutes(text: str) -> Optional[int]:
    """Slurm time limit in minutes (seconds rounded up); ``None`` for no limit.

    ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; ``30:00`` is 30 minutes.
    Raises ValueError on anything else.
    """
    text = (text or "").strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", ""):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(f"not a Slurm time limit: {text!r}")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        d, h, mi, s = int(days), int(a), int(b or 0), int(c or 0)
    elif c is not None:  # HH:MM:SS
        d, h, mi, s = 0, int(a), int(b), int(c)
    else:  # MM[:SS]
        d, h, mi, s = 0, 0, int(a), int(b or 0)
    return d * 1440 + h * 60 + mi + (1 if s else 0)


def parse_fields(line: str) -> Dict[str, str]:
    """``scontrol show ... -o`` line -> fields; values may hold spaces (``Reason=ECC errors [root@...]``)."""
    out: Dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|\s*$)", line):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


@dataclass
class Node:
    name: str
    cpus: int
    gpus: int
    mem_mb: int
    state: str
    gres: List[Gres]


@dataclass
class Partition:
    name: str
    default: bool
    max_time_min: Optional[int]  # None: no limit
    nodes: List[Node]


def parse_node(line: str) -> Optional[Node]:
    f = parse_fields(line)
    if "NodeName" not in f:
        return None
    return Node(name=f["NodeName"], cpus=_int(f.get("CPUTot")), gpus=gpu_count(f.get("Gres", "")),
                mem_mb=_int(f.get("RealMemory")), state=f.get("State", ""), gres=parse_gres(f.get("Gres", "")))


def parse_partitions(partition_text: str, node_text: str) -> Dict[str, Partition]:
    nodes = {n.name: n for n in map(parse_node, node_text.splitlines()) if n is not None}
    out = {}
    for line in partition_text.splitlines():
        f = parse_fields(line)
        if "PartitionName" not in f:
            continue
        try:
            max_time = time_limit_minutes(f.get("MaxTime", "UNLIMITED"))
        except ValueError:
            max_time = None  # unreadable: no check rather than a wrong one
        names = list(nodes) if f.get("Nodes") == "ALL" else expand_nodelist(f.get("Nodes", ""))
        out[f["PartitionName"]] = Partition(f["PartitionName"], f.get("Default") == "YES", max_time,
                                            [nodes[n] for n in names if n in nodes])
    return out


def parse_config(text: str) -> Dict[str, str]:
    """``scontrol show config`` -> ``{"MaxArraySize": "1001", ...}``."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class ArrayLimits:
    max_array_size: int  # the largest array INDEX is max_array_size - 1
    max_array_tasks: Optional[int]  # SchedulerParameters max_array_tasks (tasks per array), if set
    # MaxJobCount: jobs (array tasks one by one) slurmctld holds at once; not part of the array limits' equality
    max_job_count: Optional[int] = field(default=None, compare=False)

    @property
    def tasks_per_array(self) -> int:
        """How many tasks one array (indices from 0) may hold."""
        return min(self.max_array_size, self.max_array_tasks or self.max_array_size)


def array_limits_from(config: Dict[str, str]) -> ArrayLimits:
    size = _int(config.get("MaxArraySize"), DEFAULT_MAX_ARRAY_SIZE) or DEFAULT_MAX_ARRAY_SIZE
    m = re.search(r"(?:^|,)max_array_tasks=(\d+)", config.get("SchedulerParameters", ""))
    return ArrayLimits(size, int(m.group(1)) if m else None, _int(config.get("MaxJobCount")) or None)


def _int(value: Optional[str], default: int = 0) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


class SubmitCap(NamedTuple):
    """A cap on the user's jobs in the queue: how many, who sets it, and the squeue filter that counts the
    jobs it binds (an association's jobs are those of its account; a QOS's MaxSubmitPU those in that QOS)."""

    limit: int
    where: str
    scope: Tuple[str, ...]


def parse_max_submit(assoc_text: str, qos_text: str, account: Optional[str], qos: Optional[str],
                     user: str, default_account: Optional[str] = None) -> Optional[SubmitCap]:
    """The tightest cap on this user's jobs in the queue, and who sets it.

    ``assoc_text``: ``sacctmgr -n -P show assoc where user=USER format=Account,User,MaxSubmit,QOS,DefaultQOS``;
    ``qos_text``: ``sacctmgr -n -P show qos format=Name,MaxSubmitPU``. The association is the one of
    ``account``, else of the user's default account (where sbatch puts a job without ``--account``), else
    the user's first; the QOS is ``qos``, else the association's default QOS.
    """
    rows = [line.split("|") for line in assoc_text.splitlines() if line.count("|") >= 4]
    rows = [r for r in rows if r[1] == user]
    if account:
        rows = [r for r in rows if r[0] == account]
    elif default_account and any(r[0] == default_account for r in rows):
        rows = [r for r in rows if r[0] == default_account]
    caps: List[SubmitCap] = []
    chosen_qos = qos
    if rows:
        acct, _, max_submit, _, default_qos = rows[0][:5]
        if max_submit.strip().isdigit():
            caps.append(SubmitCap(int(max_submit), f"the association of user {user}, account {acct}", ("-A", acct)))
        chosen_qos = chosen_qos or default_qos.strip() or None
    for line in qos_text.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and chosen_qos and parts[0] == chosen_qos and parts[1].strip().isdigit():
            caps.append(SubmitCap(int(parts[1]), f"QOS {chosen_qos} (MaxSubmitJobsPerUser)", ("-q", chosen_qos)))
    return min(caps, key=lambda c: c.limit) if caps else None


@dataclass(frozen=True)
class Usage:
    """One attempt of one job (array task) as accounting saw it; a requeued task has one per attempt."""

    job_id: str  # "123_4" or "125"
    state: str  # sacct's, e.g. COMPLETED, REQUEUED, PREEMPTED, RUNNING
    elapsed_s: int
    cpus: int
    gpus: int
    start: Optional[str] = None  # ISO time as sacct prints it; None while pending
    end: Optional[str] = None

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600.0

    @property
    def cpu_hours(self) -> float:
        return self.cpus * self.elapsed_s / 3600.0


USAGE_FIELDS = ("JobID", "State", "ElapsedRaw", "AllocTRES", "Start", "End")


def tres_counts(text: str) -> Dict[str, int]:
    """``"billing=4,cpu=4,gres/gpu:a100=2,gres/gpu=2,mem=16G,node=1"`` -> ``{"cpu": 4, "gpu": 2, "node": 1}``.

    Sites that account typed GPUs list each type and the total (``gres/gpu:a100=2,gres/gpu=2``): the total
    counts; typed entries are summed only where no total is given.
    """
    counts: Dict[str, int] = {}
    typed_gpus = 0
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not value.isdigit():
            continue  # mem=16G, billing with a unit, an empty field
        if name == "gres/gpu":
            counts["gpu"] = int(value)
        elif name.startswith("gres/gpu:"):
            typed_gpus += int(value)
        elif name in ("cpu", "node"):
            counts[name] = int(value)
    counts.setdefault("gpu", typed_gpus)
    return counts


def parse_usage(text: str) -> "Tuple[List[Usage], int]":
    """sacct's ``-P -X -D -o JobID,State,ElapsedRaw,AllocTRES,Start,End`` lines -> attempts, and how many
    lines could not be read (a field missing, a number that is not one): those are left out, not guessed."""
    rows: List[Usage] = []
    unreadable = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != len(USAGE_FIELDS) or not parts[0] or not parts[2].strip().isdigit():
            unreadable += 1
            continue
        job_id, state, elapsed, tres, start, end = parts
        counts = tres_counts(tres)
        when = lambda t: None if t in ("", "Unknown", "None") else t  # noqa: E731
        for one in expand_array_ids(job_id):
            rows.append(Usage(one, state.split()[0] if state.strip() else "UNKNOWN", int(elapsed),
                              counts.get("cpu", 0), counts.get("gpu", 0), when(start), when(end)))
    return rows, unreadable
