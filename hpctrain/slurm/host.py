"""Slurm asked from inside a job through its host side: request files answered by the batch script's helper.

A job's tasks may run inside a container image that has no Slurm client and no munge socket (a
PyTorch-CUDA Apptainer image), so nothing in them calls ``scontrol`` or ``squeue``. The batch script
starts a small shell loop on the host before ``srun`` (:func:`hpctrain.submit.backends.slurm.host_lines`);
every half second it touches its heartbeat, takes each request file in the job's own host dir and answers it
(``$HPCTRAIN_HOST_DIR``, under the sweep dir, which every container binds): the command's output, then
``rc=N``. The requests are a fixed few (:class:`Request`); the shell maps each to its Slurm command, so the
job step never names a command the host runs. The same path with or without a container: one mechanism.

A helper that is gone (no heartbeat for :data:`STALE_S` and the request not taken) or an answer that does not
come in time is an
Answer with ``stdout=None``: unknown, as any failed Slurm query (:mod:`hpctrain.slurm.query`).
No torch here.
"""

import itertools
import os
import time
from enum import Enum
from pathlib import Path
from typing import Iterable, Optional

from hpctrain.slurm.parse import QueueState, array_ids
from hpctrain.slurm.query import Answer, queue_from, squeue as squeue_here

HOST_DIR_ENV = "HPCTRAIN_HOST_DIR"  # set by the batch script, passed into the container (APPTAINERENV_)
HEARTBEAT = "alive"  # touched by the helper on every round
STALE_S = 2.0  # the helper's round is 0.5 s: a heartbeat older than this means it is gone
_numbers = itertools.count()


class Request(str, Enum):
    """What the host side answers (the shell's ``case`` in the batch script maps each to its command)."""

    SHOW = "show"  # scontrol show job -o TASK (this array task, 12_3; else $SLURM_JOB_ID)
    REQUEUE = "requeue"  # scontrol requeue TASK
    SQUEUE = "squeue"  # squeue -h -r -j IDS -o %i|%T|%r
    EXCLUDE = "exclude"  # scontrol requeuehold, update ExcNodeList=NODES, release: a requeue away from NODES
    NODES = "nodes"  # sinfo -h -N -p $SLURM_JOB_PARTITION -o %N|%T: the job's partition's nodes and their states


def host_dir() -> Optional[Path]:
    """This job's host dir; None outside a batch script that has the helper (login node, local launcher)."""
    value = os.environ.get(HOST_DIR_ENV)
    return Path(value) if value else None


def ask(request: Request, argument: str = "", timeout_s: float = 15.0) -> Answer:
    """The host side's answer to one request; ``stdout=None`` with the reason when there is none."""
    where = host_dir()
    if where is None:
        return Answer(None, f"no host-side helper ({HOST_DIR_ENV} unset: not in an hpctrain batch job)", 127)
    name = f"{os.getpid()}-{next(_numbers)}-{time.time_ns()}"
    text = f"{request.value} {argument}".strip()
    try:
        tmp = where / f"{name}.tmp"
        tmp.write_text(text)
        asked = where / f"{name}.ask"
        os.replace(tmp, asked)  # the helper reads only whole requests
    except OSError as exc:
        return Answer(None, f"cannot write a request into {where}: {exc}", 1)
    answer = where / f"{name}.answer"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = answer.read_text()
            answer.unlink()
            return parse_answer(text, request)
        except FileNotFoundError:
            pass
        except OSError as exc:
            return Answer(None, f"cannot read the host side's answer {answer}: {exc}", 1)
        if not helper_alive(where) and asked.exists():  # not taken up; once taken, a slow Slurm call may follow
            _withdraw(asked)
            return Answer(None, f"the host-side helper is gone (no heartbeat in {where} for {STALE_S:g} s)", 1)
        time.sleep(0.05)
    _withdraw(asked)
    return Answer(None, f"the host-side helper did not answer {request.value} within {timeout_s:g} s", 1)


def _withdraw(asked: Path) -> None:
    """A request given up on is taken back before the helper runs it: else a helper still busy with a slow
    call would next spend a Slurm call on it, and an asker whose every retry lands on the slow call (a query
    slow every other call) would never be answered."""
    try:
        asked.unlink()
    except OSError:
        pass  # taken up already


def helper_alive(where: Path, now: Optional[float] = None) -> bool:
    try:
        age = (time.time() if now is None else now) - (where / HEARTBEAT).stat().st_mtime
    except OSError:
        return False
    return age < STALE_S


def parse_answer(text: str, request: Request) -> Answer:
    """The helper's file: the command's output (stdout and stderr), then ``rc=N`` on the last line."""
    lines = text.rstrip("\n").split("\n")
    last = lines.pop() if lines else ""
    if not last.startswith("rc=") or not last[3:].isdigit():
        return Answer(None, f"a torn answer from the host side to {request.value}", 1)
    rc, output = int(last[3:]), "\n".join(lines)
    if rc != 0:
        return Answer(None, " ".join(output.split()) or f"exit code {rc}", rc)
    return Answer(output + "\n" if output else "")


def show_job(timeout_s: float = 15.0) -> Answer:
    """``scontrol show job -o`` of this job, asked on the host."""
    return ask(Request.SHOW, timeout_s=timeout_s)


def requeue(timeout_s: float = 60.0) -> Answer:
    """``scontrol requeue`` of this job (an array task: ``ARRAY_TASK``, never the array), run on the host."""
    return ask(Request.REQUEUE, timeout_s=timeout_s)


EXCLUDE_FAILED = "hpctrain-exclude-failed"  # the helper's word: requeued, but the node list was not changed


def requeue_avoiding(nodes: Iterable[str], timeout_s: float = 60.0) -> Answer:
    """A requeue of this job with ``nodes`` as its whole ``ExcNodeList`` (the nodes it excluded before among them:
    :func:`hpctrain.slurm.exclusion.decide`): the helper holds the requeued job, sets the list and releases it."""
    return ask(Request.EXCLUDE, ",".join(nodes), timeout_s=timeout_s)


def partition_nodes(timeout_s: float = 15.0) -> Answer:
    """``sinfo`` of this job's partition, asked on the host: one ``node|state`` line a node."""
    return ask(Request.NODES, timeout_s=timeout_s)


def squeue(job_ids: Iterable[Optional[str]], timeout_s: float = 30.0) -> Optional[QueueState]:
    """:func:`hpctrain.slurm.query.squeue`, asked on the host inside a job, directly elsewhere (the login
    node, a local run); None: unknown."""
    if host_dir() is None:
        return squeue_here(job_ids)
    ids = array_ids(job_ids)
    if not ids:
        return {}
    ans = ask(Request.SQUEUE, ",".join(ids), timeout_s=timeout_s)
    if ans.stdout is None:
        return {} if "Invalid job id" in ans.error else None
    return queue_from(ans.stdout)
