"""submitit's private names: its sbatch writer, memory format, signal and local process.

When a release moves one of these, this module is the one to change.
"""

import functools
from typing import Any, Dict, Optional


# submitit
def convert_mem(mem_gb: float) -> str:
    """submitit's sbatch ``--mem`` value for a size in GB."""
    from submitit.slurm.slurm import _convert_mem

    return _convert_mem(mem_gb)


def make_sbatch_string(**params: Any) -> str:
    """The sbatch script submitit would submit (for ``dry_run``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(**params)


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


def local_job_exit_code(job: Any) -> Optional[int]:
    """The exit code of a submitit LocalJob's controller process (None while it runs or if unknown)."""
    process = getattr(job, "_process", None)
    return process.poll() if process is not None else None
