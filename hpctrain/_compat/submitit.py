"""submitit's private names: its sbatch writer, memory format, signal, local process, the module its
jobs run and the layout of its folder (log and result file names, the result pickle's first item).

When a release moves one of these, this module is the one to change (canaries: tests/test_compat.py).
"""

import contextlib
import functools
import os
import pickletools
from typing import Any, Callable, Dict, Iterator, List, Optional

# the module submitit's sbatch script runs on every task: ``python -u -m submitit.core._submit FOLDER``

# what submitit's result pickle holds first: ``("success", result)`` or ``("error", traceback)``
OUTCOMES = ("success", "error")


# submitit
def convert_mem(mem_gb: float) -> str:
    """submitit's sbatch ``--mem`` value for a size in GB."""
    from submitit.slurm.slurm import _convert_mem

    return _convert_mem(mem_gb)


def sbatch_script(executor: Dict[str, Any], parameters: Dict[str, Any], n_tasks: int) -> str:
    """The sbatch script a ``SlurmExecutor(**executor)`` with ``parameters`` writes for ``n_tasks`` tasks,
    by submitit's own writer and command line (no srun needed: nothing is submitted)."""
    writer = _script_writer()(**executor)
    writer.update_parameters(**parameters)
    if n_tasks > 1:  # as map_array sets it on its copy of the executor
        writer.parameters["map_count"] = n_tasks
    return writer._make_submission_file_text(writer._submitit_command_str, "dry-run")


@functools.lru_cache(maxsize=None)
def _script_writer() -> Any:
    from submitit.slurm.slurm import SlurmExecutor

    class ScriptWriter(SlurmExecutor):
        @classmethod
        def affinity(cls) -> int:
            return 1  # SlurmExecutor refuses to exist without srun; writing a script needs none

    return ScriptWriter


def preemption_signal() -> Any:
    """The signal submitit sends before the time limit or on preemption (USR2 unless configured)."""
    from submitit import JobEnvironment

    return JobEnvironment._usr_sig()


def requeue_through(handler: Any, requeue: Callable[[int], None]) -> None:
    """Make submitit's preemption handler (``handler``, as ``signal.getsignal`` returned it) requeue by calling
    ``requeue(countdown)`` instead of running ``scontrol requeue`` itself (its job environment's ``_requeue``)."""
    env = getattr(getattr(handler, "__self__", None), "env", None)  # submitit's SignalHandler and its environment
    if env is not None:
        env._requeue = requeue


def checkpoint_for_requeue(handler: Any) -> None:
    """What submitit's preemption handler (``handler``, as ``signal.getsignal`` returned it) does before its
    ``scontrol requeue``: the job's ``checkpoint()`` and the pickle the next attempt runs. For a job that
    Slurm requeued itself. Raises when submitit would not requeue (the checkpoint returned None)."""
    from submitit.core.job_environment import _checkpoint

    owner = handler.__self__  # submitit's SignalHandler
    delayed = owner._delayed
    reason = _checkpoint(delayed, owner._job_paths.submitted_pickle, delayed._timeout_countdown)
    if reason:
        raise RuntimeError(f"submitit cannot checkpoint the job: {reason}")


def local_job_exit_code(job: Any) -> Optional[int]:
    """The exit code of a submitit LocalJob's controller process (None while it runs or if unknown)."""
    process = getattr(job, "_process", None)
    return process.poll() if process is not None else None


def log_path(folder: "str | os.PathLike[str]", job_id: str, stream: str = "out") -> str:
    """submitit's log of rank 0: ``<folder>/<job_id>_0_log.out`` (``<array>_<task>_0_log.out`` for arrays),
    as its ``JobPaths(folder, job_id, task_id=0).stdout``/``.stderr``."""
    return os.path.join(folder, log_name(job_id, stream))  # a plain string: status builds thousands


def log_name(job_id: str, stream: str = "out") -> str:
    """The name of :func:`log_path` in its folder."""
    return f"{job_id}_0_log.{stream}"


def result_path(folder: "str | os.PathLike[str]", job_id: str) -> str:
    """submitit's result pickle of rank 0, as its ``JobPaths(folder, job_id, task_id=0).result_pickle``."""
    return os.path.join(folder, f"{job_id}_0_result.pkl")


def result_outcome(folder: "str | os.PathLike[str]", job_id: str) -> Optional[str]:
    """``"success"``/``"error"`` from submitit's result pickle of rank 0, None when there is none.

    Read with pickletools, never unpickled (the result may hold objects whose import is heavy or
    unsafe): the pickle's first string is the outcome, ahead of the result itself.
    """
    try:
        with open(result_path(folder, job_id), "rb") as f:
            for opcode, arg, _ in pickletools.genops(f):
                if isinstance(arg, str) and "UNICODE" in opcode.name:
                    return arg if arg in OUTCOMES else None
    except (OSError, ValueError, EOFError):  # none, or not (yet) a whole pickle
        return None
    return None


def private_pickles() -> None:
    """submitit's pickles (the job each task unpickles) written never writable by group or others, whatever
    the umask, and never through a planted link: ``submitit.core.utils.cloudpickle_dump`` replaced (once)."""
    from submitit.core import utils

    if getattr(utils.cloudpickle_dump, "hpctrain", False):
        return
    import pickle

    import cloudpickle

    from hpctrain.core import atomic, safefs

    def cloudpickle_dump(obj: Any, filename: Any) -> None:
        data = cloudpickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        mode = _SENDING[0] if _SENDING[0] is not None else safefs.exec_file_mode()
        try:  # a new name (submitit's are random): made here, as the user alone may write it
            fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | safefs.NOFOLLOW, mode)
        except FileExistsError:  # written again (a checkpoint before a requeue): replaced whole
            atomic.write_bytes_atomic(filename, data, mode)
            return
        with open(fd, "wb") as f:
            f.write(data)

    cloudpickle_dump.hpctrain = True  # type: ignore[attr-defined]
    utils.cloudpickle_dump = cloudpickle_dump


_SENDING: List[Optional[int]] = [None]  # the pickles' mode while one submission's arrays are sent


@contextlib.contextmanager
def pickles_of_one_mode() -> Iterator[None]:
    """Within this (a submission's ``map_array`` calls), the pickles' mode is worked out once from the umask,
    not once a pickle (each a read of ``/proc/self/status``: 10,000 for 10,000 tasks); nothing in between
    changes this process's umask."""
    from hpctrain.core import safefs

    _SENDING[0] = safefs.exec_file_mode()
    try:
        yield
    finally:
        _SENDING[0] = None


def unsent_scripts(folder: "str | os.PathLike[str]") -> "list[str]":
    """The sbatch scripts submitit wrote whose job id it never took in: ``.submission_file_<uuid>.sh`` in the
    job-independent part of ``folder``, still a plain file (submitit moves it into the job's folder and leaves
    a symlink once ``sbatch`` has answered). Each is an sbatch that failed, or whose caller was killed."""
    from submitit.core.utils import JobPaths

    base = JobPaths.get_first_id_independent_folder(os.fspath(folder))
    try:
        names = os.listdir(base)
    except OSError:
        return []
    paths = (os.path.join(base, n) for n in names if n.startswith(".submission_file_") and n.endswith(".sh"))
    return sorted(p for p in paths if not os.path.islink(p) and os.path.isfile(p))
