"""Any Hydra app in a search: report the objective, learn where to stop, keep state in the trial's directory.

hpctrain's trainer does all of this itself; an app of your own takes part in a search with a scheduler
(``hydra.sweeper.scheduler=asha|hyperband|pbt``) through these few calls (``from hpctrain import trial``)::

    from hpctrain import trial

    @hydra.main(config_path=None, config_name="config", version_base=None)  # config has max_steps
    def main(cfg):
        state = trial.load_state() or {"step": 0, "x": 0.0}   # a paused trial resumes from its state
        end = trial.end_step(cfg.max_steps)                   # the unit's end (max_steps outside a search)
        while state["step"] < end:
            state["x"] -= cfg.lr * 2 * (state["x"] - 3)       # one training step
            state["step"] += 1
            if state["step"] % cfg.eval_every == 0:
                trial.report((state["x"] - 3) ** 2, state["step"])
        trial.save_state(state)                               # exactly at the end step
        return (state["x"] - 3) ** 2                          # the objective at the end step

Stop at :func:`end_step` and return the objective there; the worker then pauses the trial (or completes it
at ``max_steps``). A schedule that depends on ``max_steps`` (an LR decay) must keep using ``max_steps``,
not the end step, so that a paused and resumed trial equals an uninterrupted one. Outside a search every
call is harmless: ``end_step`` is its default, ``report`` does nothing, the state lives in the run's output
directory. The login node refuses ``scheduler != none`` for an app whose source file does not name this
module (``hpctrain.trial`` or ``hpctrain.search.api``). Import-light: no optuna, no torch.
"""

import os
from pathlib import Path
from typing import Any, Dict, Optional

from hpctrain.core.atomic import read_json, write_json_atomic
from hpctrain.core.paths import CKPT_DIR
from hpctrain.search import bridge

STATE_DIR = CKPT_DIR
STATE_FILE = "state.json"


def current() -> Optional[bridge.TrialBridge]:
    """The search trial this process runs (``.number``, ``.end``, ``.max_steps``, ``.run_dir``), or None."""
    return bridge.current()


def end_step(default: int) -> int:
    """Where this run must stop: the unit's end step in a search with a scheduler, else ``default``."""
    t = bridge.current()
    return int(t.end) if t is not None and t.end is not None else int(default)


def report(value: float, step: int) -> bool:
    """The objective at ``step`` (rank 0 reports it to the study); True when the pruner says to stop
    (``scheduler=none`` with a pruner): end the run then, returning the value."""
    t = bridge.current()
    return bool(t is not None and t.should_prune(value, step))


def run_dir() -> Path:
    """The trial's run directory (one per trial, kept across its units), else Hydra's output directory."""
    t = bridge.current()
    if t is not None and t.run_dir:
        return Path(t.run_dir)
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return Path(os.getcwd())


def state_dir() -> Path:
    """``<run_dir>/checkpoints``, created: where an app keeps what it needs to resume."""
    d = run_dir() / STATE_DIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_state(state: Dict[str, Any], name: str = STATE_FILE) -> Path:
    """A JSON state, written atomically (complete or absent) into :func:`state_dir`."""
    path = state_dir() / name
    write_json_atomic(path, state)
    return path


def load_state(name: str = STATE_FILE) -> Optional[Dict[str, Any]]:
    """The state last saved by :func:`save_state`, or None (a new trial)."""
    return read_json(state_dir() / name)
