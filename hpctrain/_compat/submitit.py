"""submitit's private names: its sbatch writer, memory format, signal and local process.

When a release moves one of these, this module is the one to change.
"""

from typing import Any, Optional


# submitit
def convert_mem(mem_gb: float) -> str:
    """submitit's sbatch ``--mem`` value for a size in GB."""
    from submitit.slurm.slurm import _convert_mem

    return _convert_mem(mem_gb)


def make_sbatch_string(**params: Any) -> str:
    """The sbatch script submitit would submit (for ``dry_run``)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(**params)


def preemption_signal() -> Any:
    """The signal submitit sends before the time limit or on preemption (USR2 unless configured)."""
    from submitit import JobEnvironment

    return JobEnvironment._usr_sig()


def local_job_exit_code(job: Any) -> Optional[int]:
    """The exit code of a submitit LocalJob's controller process (None while it runs or if unknown)."""
    process = getattr(job, "_process", None)
    return process.poll() if process is not None else None
