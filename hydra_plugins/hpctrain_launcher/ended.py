"""After a job's tasks return: a run that died without a word (killed, out of memory) is marked failed.

The job script runs this right after ``srun`` (``python -m hydra_plugins.hpctrain_launcher.ended RUNS
INDEX RC``); the local launcher calls :func:`mark_ended` when a job's process ends. A run that
finished, failed with an exception, or was checkpointed for a requeue has already said so in its
metrics.json and is left alone. No torch here.
"""

import json
import sys
from pathlib import Path
from typing import Optional

from hpctrain import runfiles


def mark_ended(run_dir: Path, exit_code: Optional[int], log_path: str = "") -> bool:
    """Mark the run failed if its own record still says it is running (or it never wrote one)."""
    record = runfiles.read_metrics(run_dir)
    if record is not None and record.get("status") != runfiles.RUNNING:
        return False
    if record is None and not exit_code:
        return False
    where = f"; see {log_path}" if log_path else ""
    runfiles.update_metrics(
        run_dir,
        status=runfiles.FAILED,
        error=f"the job's tasks ended with exit code {exit_code} while the run was still running "
              f"(killed, out of memory, or a node failure){where}",
    )
    return True


def main(argv: list) -> int:
    runs_file, index, exit_code = argv[0], int(argv[1] or 0), int(argv[2])
    run_dirs = json.loads(Path(runs_file).read_text())
    if 0 <= index < len(run_dirs):
        mark_ended(Path(run_dirs[index]), exit_code, argv[3] if len(argv) > 3 else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
