"""The Checkpointer: when to save, atomic saves with the previous checkpoint kept, the newest complete one loaded.

What is saved comes from Stateful parts (``state_dict()`` / ``load_state_dict()``): the trainer's own
(model, optimizer, scheduler, scaler, step, config: the top-level keys of ``last.pt``), the data
position (``data``) and every rank's RNG state (``rng``, one entry per rank), which the Checkpointer
owns. A checkpoint only counts once complete: written to a temporary file in the same directory,
fsynced, then renamed over ``last.pt`` after the old ``last.pt`` is renamed to ``previous.pt``. A torn
or unreadable ``last.pt`` is skipped for ``previous.pt`` with a warning.

Everything saved is of a type ``torch.load(..., weights_only=True)`` accepts, and checkpoints are
loaded that way: nothing from shared storage is unpickled as code.
"""

import logging
import os
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Tuple

import numpy as np
import torch
import torch.distributed as dist

from hpctrain.core import events
from hpctrain.core import paths as runfiles
from hpctrain.core.errors import disk_full
from hpctrain.train.distributed import DistInfo

log = logging.getLogger(__name__)



class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class Checkpointer:
    """Saves every ``every`` steps (0: only when forced) and loads the newest complete checkpoint.

    ``save`` and ``load`` are called on every rank (the RNG states are gathered; all ranks wait for the
    file); rank 0 alone writes.
    """

    def __init__(self, path: Path, every: int, info: DistInfo, trainer: Stateful, data: Stateful) -> None:
        self.path, self.every, self.info = Path(path), int(every or 0), info
        self.trainer, self.data, self.rng = trainer, data, RankRNG(info)
        self.saved_step: Optional[int] = None
        self.run_dir = self.path.parent.parent  # <run_dir>/checkpoints/last.pt (core.paths.CKPT)

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def next_due(self, step: int) -> Optional[int]:
        """The first step after ``step`` at which a save is due; None: only forced saves."""
        return (step // self.every + 1) * self.every if self.every > 0 else None

    def save(self, step: int, force: bool = False) -> bool:
        """Save if due at ``step`` (or ``force``: the run's last step, a preemption); True if it saved."""
        if not (force or self.due(step)) or step == self.saved_step:
            return False
        state = self.state_dict()  # a collective: every rank's RNG state
        if self.info.is_main:
            save_atomic(state, self.path)
            events.checkpoint_at(self.run_dir, step)
        if self.info.enabled:
            dist.barrier()  # nobody moves on (or exits for a requeue) before the checkpoint exists
        self.saved_step = step
        return True

    def load(self) -> Optional[int]:
        """Restore the newest complete checkpoint (``last.pt``, else ``previous.pt``); its step, or None."""
        if self.info.is_main:
            remove_partial(self.path)
        state, source = load(self.path, map_location=self.info.device)
        if state is None:
            return None
        self.load_state_dict(state)
        log.info("resumed from %s at step %d", source, int(state["step"]))
        if self.info.is_main:
            events.checkpoint_at(self.run_dir, int(state["step"]))
        return int(state["step"])

    def state_dict(self) -> Dict[str, Any]:
        return {**self.trainer.state_dict(), "data": self.data.state_dict(), "rng": self.rng.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)
        self.data.load_state_dict(state["data"])
        self.rng.load_state_dict(state["rng"])


class RankRNG:
    """Every rank's RNG states (python, numpy, torch, its own CUDA device), saved as a list in rank order."""

    def __init__(self, info: DistInfo) -> None:
        self.info = info

    def state_dict(self) -> List[Dict[str, Any]]:
        return gather_rng_states(self.info.device, self.info.world_size)

    def load_state_dict(self, states: Any) -> None:
        restore_rng_states(states, self.info.rank, self.info.device)


# ------------------------------------------------------------------------------------------ files
def previous_path(path: Path) -> Path:
    return path.with_name(runfiles.PREVIOUS_CKPT)


def save_atomic(state: Dict[str, Any], path: Path) -> None:
    """A temp file, fsynced, renamed over ``path`` (the old one kept as previous.pt); no temp file left on
    failure, and a full disk raised as DiskFullError naming its file system (not torch's zip writer error)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.replace(path, previous_path(path))  # between the two renames, load() finds previous.pt
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        full = disk_full(exc, path.parent)
        if full is None or full is exc:
            raise
        raise full from exc
    finally:
        tmp.unlink(missing_ok=True)


def remove_partial(path: Path) -> None:
    """Delete temporary files left by a save that was killed half-way (never a complete checkpoint)."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        tmp.unlink(missing_ok=True)


def load(path: Path, map_location: Any = "cpu") -> Tuple[Optional[Dict[str, Any]], Optional[Path]]:
    """The newest readable checkpoint and the file it came from: ``last.pt``, else ``previous.pt``.

    (None, None) when there is none. A file that exists but cannot be read is logged and skipped.
    """
    for candidate in (path, previous_path(path)):
        if not candidate.is_file():
            continue
        try:
            state = torch.load(candidate, map_location=map_location, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torn zip, truncated pickle, foreign types: all unreadable
            log.warning("checkpoint %s is unreadable (%s: %s): trying the previous one", candidate,
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            continue
        if isinstance(state, dict) and "step" in state:
            return state, candidate
        log.warning("checkpoint %s holds no step: trying the previous one", candidate)
    return None, None


# ------------------------------------------------------------------------------------------ RNG
def rng_state(device: Optional[torch.device] = None) -> Dict[str, Any]:
    """This process's RNG states as weights_only-loadable types; on CUDA, this rank's own device only."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        "python": random.getstate(),  # (version, tuple of ints, None): plain types
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if device is not None and device.type == "cuda":
        if "cuda" not in state:
            # a run saved on CPU resumed on a GPU: its dropout masks cannot continue the saved stream
            log.warning("checkpoint has no CUDA RNG state (saved on CPU): %s keeps its seeded state", device)
            return
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def gather_rng_states(device: torch.device, world_size: int) -> List[Dict[str, Any]]:
    """Every rank's RNG state, in rank order (a collective when world_size > 1: call on all ranks)."""
    mine = rng_state(device)
    if world_size == 1:
        return [mine]
    states: List[Any] = [None] * world_size
    dist.all_gather_object(states, mine)
    return states


def restore_rng_states(states: Any, rank: int, device: torch.device) -> None:
    """Rank r takes the state rank r saved. A rank the saving run did not have (more ranks now) keeps
    its seeded state; a CUDA state saved on CPU or restored on CPU is skipped. So a resume with a
    different number of ranks or devices works, and is bit-exact when nothing changed."""
    if isinstance(states, dict):  # one state for all ranks (a single-process checkpoint)
        states = [states]
    if rank < len(states):
        set_rng_state(states[rank], device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
