"""A run without a launcher (``python -m hpctrain`` in run mode, torchrun): its own heartbeat dir and watchdog.

Nothing retries such a run, but a stalled one is still ended with its stacks rather than left hanging: the
watchdog records the attempt ``hung``, says one line on stderr (rank, step, frame, the stacks' dir) and kills
the node's ranks, so the command exits non-zero. Under torchrun a node's ranks are the children of one agent:
its pid and restart count name their dir, so they agree on it without a word (their run dirs need not be
spelled alike); local rank 0 starts the watchdog, before its process group exists. A heartbeat dir set
already (the user's own wrapper) is left alone. No torch here.
"""

import os
import subprocess
from pathlib import Path
from typing import Any, Optional

from hpctrain.job import heartbeat, watchdog


def directory() -> Path:
    """This node's heartbeat dir for the run: torchrun's agent and restart, else this process."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        key = f"torchrun{os.getppid()}-r{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    else:
        key = f"pid{os.getpid()}-r0"
    return heartbeat.root() / f"direct-{key}"


def begin(config: Any, run_dir: Path) -> "Optional[subprocess.Popen[bytes]]":
    """Watch this run (the watchdog on local rank 0); its process, or None (off, or watched by another)."""
    if os.environ.get(heartbeat.DIR_ENV):
        return None
    where = directory()
    settings = watchdog.settings_of(config, where, run_dir, "")
    if settings is None:
        return None
    dog = watchdog.start(settings) if int(os.environ.get("LOCAL_RANK", "0")) == 0 else None
    os.environ[heartbeat.DIR_ENV] = str(where)
    return dog


def end(dog: "Optional[subprocess.Popen[bytes]]") -> None:
    os.environ.pop(heartbeat.DIR_ENV, None)
    watchdog.stop(dog)
