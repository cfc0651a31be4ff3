"""Every Slurm query in one place (squeue, sacct, scontrol, scancel); the answers read by :mod:`hpctrain.slurm.parse`.

Below both the launcher and the review commands; no torch, no hpctrain.review import.

The rule for every query: a call that fails (tool missing, non-zero exit, timeout, controller busy)
answers ``None``, meaning *unknown*. It never answers an empty result, which would read as "every job
has left the queue". Callers that poll (``wait=true``, ``status --watch``) use :class:`Poller`, which
keeps the last good answer through a few failed calls in a row and says so when it lasts.
"""


import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Generic, Iterable, List, Optional, Sequence, Tuple, TypeVar

from hpctrain.slurm.parse import (
    USAGE_FIELDS,
    ArrayLimits,
    Partition,
    QueueState,
    array_ids,
    array_limits_from,
    expand_array_ids,
    parse_config,
    parse_max_submit,
    SubmitCap,
    parse_partitions,
    parse_usage,
    Usage,
)

TIMEOUT_S = 30


@dataclass
class Answer:
    """One call's outcome: ``stdout`` when it worked, else ``None`` and the reason in ``error``."""

    stdout: Optional[str]
    error: str = ""
    returncode: int = 0


def run(argv: Sequence[str], timeout_s: float = TIMEOUT_S) -> Answer:
    """Run a Slurm command; any failure is an Answer with ``stdout=None`` and a one-line error."""
    if shutil.which(argv[0]) is None:
        return Answer(None, f"{argv[0]}: not found on PATH (not a Slurm login node?)", 127)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Answer(None, f"{argv[0]}: {exc}", 1)
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        return Answer(None, err, proc.returncode)
    return Answer(proc.stdout)


def have_slurm() -> bool:
    return shutil.which("squeue") is not None


def squeue(job_ids: Iterable[Optional[str]]) -> Optional[QueueState]:
    """``{"123_4": ("PENDING", "Priority"), "125": ("RUNNING", "None")}`` for jobs still in the queue;
    ``None`` when the queue could not be asked.

    ``-r`` prints one line per array task. Slurm answers "Invalid job id" when a single id is no
    longer known (purged after ``MinJobAge``): that alone is an empty queue, not an error.
    """
    ids = array_ids(job_ids)
    if not ids:
        return {} if have_slurm() else None
    ans = run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%r"])
    if ans.stdout is None:
        return {} if "Invalid job id" in ans.error else None
    return queue_from(ans.stdout)


def queue_from(stdout: str) -> QueueState:
    """squeue's ``%i|%T|%r`` lines as :data:`QueueState` (array tasks expanded)."""
    out: QueueState = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            for job_id in expand_array_ids(parts[0]):
                out[job_id] = (parts[1], parts[2])
    return out


def sacct(job_ids: Iterable[Optional[str]]) -> Optional[Dict[str, str]]:
    """Final states from accounting (``{"123_4": "COMPLETED"}``); ``None`` where accounting is off or failed."""
    ids = array_ids(job_ids)
    if not ids:
        return {}
    ans = run(["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State"])
    if ans.stdout is None:
        return None
    out: Dict[str, str] = {}
    for line in ans.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 2 and parts[1].strip():
            for job_id in expand_array_ids(parts[0]):
                out[job_id] = parts[1].split()[0]  # "CANCELLED by 0" -> CANCELLED
    return out


def scancel(job_ids: List[str]) -> Tuple[int, str]:
    """Cancel jobs or array tasks (``123``, ``123_4``); scancel's exit code and its error line."""
    if not job_ids:
        return 0, ""
    ans = run(["scancel", *job_ids], timeout_s=60)
    return ans.returncode, ans.error


def requeue(job_id: str) -> Answer:
    """``scontrol requeue JOB``: the job goes back to the queue (its tasks are ended first)."""
    return run(["scontrol", "requeue", job_id], timeout_s=60)


T = TypeVar("T")


class Poller(Generic[T]):
    """A query asked again and again (``wait=true``, ``status --watch``) that rides out failed calls.

    :meth:`poll` returns the last good answer while up to ``patience`` calls in a row fail (``None``
    before the first good one) and prints one line to stderr when calls keep failing.
    """

    def __init__(self, query: Callable[[], Optional[T]], what: str, patience: int = 5) -> None:
        self.query, self.what, self.patience = query, what, patience
        self.last: Optional[T] = None
        self.failures = 0  # failed calls in a row

    def poll(self) -> Optional[T]:
        answer = self.query()
        if answer is not None:
            if self.failures >= 2:
                print(f"hpctrain: {self.what} answers again after {self.failures} failed calls", file=sys.stderr)
            self.failures, self.last = 0, answer
            return answer
        self.failures += 1
        if self.failures == 2 or self.failures % 10 == 0:
            print(f"hpctrain: {self.what} failed {self.failures} times in a row: the last known answer stands",
                  file=sys.stderr)
        return self.last if self.failures <= self.patience else None

    @property
    def unknown(self) -> bool:
        """Whether the last calls failed (the answer given is old or missing)."""
        return self.failures > 0


def poll_squeue(job_ids: List[str], max_interval_s: float, is_done: Callable[[QueueState], bool],
                on_change: Callable[[QueueState], None] = lambda q: None, first_interval_s: float = 0.25,
                brisk_interval_s: float = 1.0, brisk_s: float = 30.0) -> QueueState:
    """Ask squeue until ``is_done(queue)``; failed calls never end the wait (they are unknown, not gone).

    The pause starts at ``first_interval_s`` and grows by half each time: up to ``brisk_interval_s`` for
    the first ``brisk_s`` seconds (jobs that end at once, such as a config that fails at start, are seen
    to end at once), then up to ``max_interval_s`` (a long wait costs the controller one query per
    ``max_interval_s``).
    """
    poller: Poller[QueueState] = Poller(lambda: squeue(job_ids), "squeue")
    start, pause = time.monotonic(), first_interval_s
    while True:
        queue = poller.poll()
        if queue is not None and not poller.unknown:
            on_change(queue)
            if is_done(queue):
                return queue
        time.sleep(pause)
        brisk = time.monotonic() - start <= brisk_s
        pause = min(pause * 1.5, brisk_interval_s if brisk else max_interval_s)


def partitions() -> Optional[Dict[str, Partition]]:
    """Every partition with its time limit and nodes; ``None`` when scontrol cannot be asked."""
    parts = run(["scontrol", "show", "partition", "-o"])
    if parts.stdout is None:
        return None
    nodes = run(["scontrol", "show", "node", "-o"])
    if nodes.stdout is None:
        return None
    return parse_partitions(parts.stdout, nodes.stdout)


def array_limits() -> ArrayLimits:
    """The cluster's array limits; Slurm's default (1001, no task cap) when ``scontrol show config`` fails."""
    ans = run(["scontrol", "show", "config"])
    return array_limits_from(parse_config(ans.stdout) if ans.stdout is not None else {})


def _user() -> str:
    import getpass

    return getpass.getuser()


def max_submit_jobs(account: Optional[str] = None, qos: Optional[str] = None) -> Optional[SubmitCap]:
    """``(cap, who sets it)`` on the user's jobs in the queue; ``None`` when none is set or sacctmgr
    does not answer (no accounting): then nothing is checked up front and sbatch has the last word."""
    user = _user()
    with ThreadPoolExecutor(3) as pool:  # all asked at once: slurmdbd answers each in a few tenths of a second
        asked = pool.map(lambda argv: run(argv, timeout_s=15), [
            ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}",
             "format=Account,User,MaxSubmit,QOS,DefaultQOS"],
            ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU"],
            ["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"]])
        assoc, qos_ans, default = list(asked)
    if assoc.stdout is None:
        return None
    default_account = (default.stdout or "").strip().splitlines()[:1]
    return parse_max_submit(assoc.stdout, qos_ans.stdout or "", account, qos, user,
                            default_account[0].strip() if default_account else None)


def jobs_of_scripts(names: Iterable[str]) -> Optional[Dict[str, List[str]]]:
    """The user's queued or running jobs (array job ids) whose batch script has one of these file names
    (squeue's command, ``%o``); None when squeue fails."""
    wanted = set(names)
    ans = run(["squeue", "-h", "-u", _user(), "-o", "%F|%o"])
    if ans.stdout is None:
        return None
    out: Dict[str, List[str]] = {}
    for line in ans.stdout.splitlines():
        job, _, command = line.strip().partition("|")
        name = command.rsplit("/", 1)[-1]
        if name in wanted and job not in out.setdefault(name, []):
            out[name].append(job)
    return out


def jobs_in_queue_of_user(scope: Sequence[str] = ()) -> Optional[int]:
    """How many jobs (array tasks one by one) the user has in the queue, within ``scope`` (squeue's
    ``-A ACCOUNT`` or ``-q QOS``: the jobs a cap binds); None when squeue fails."""
    ans = run(["squeue", "-h", "-r", "-u", _user(), *scope, "-o", "%i"])
    return None if ans.stdout is None else len(ans.stdout.split())


def usage(job_ids: Iterable[Optional[str]]) -> "Optional[Tuple[List[Usage], int]]":
    """Every attempt of these jobs from accounting (``-D``: requeued attempts too), one call for the whole
    sweep; ``None`` where accounting is off or failed (unknown, never "no cost")."""
    ids = array_ids(job_ids)
    if not ids:
        return [], 0
    ans = run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(ids), "-o", ",".join(USAGE_FIELDS)])
    return None if ans.stdout is None else parse_usage(ans.stdout)
