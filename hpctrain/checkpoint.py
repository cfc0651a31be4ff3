"""Atomic checkpoints and RNG state.

A checkpoint only counts once it is complete: it is written to a temporary file in the same
directory, flushed to disk, then renamed over ``last.pt``. A write killed half-way leaves the previous
``last.pt`` intact.
"""

import os
import random
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch


def save_atomic(state: Dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def remove_partial(path: Path) -> None:
    """Delete temporary files left by a save that was killed half-way (never a complete checkpoint)."""
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        tmp.unlink(missing_ok=True)


def load(path: Path, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
    if not path.is_file():
        return None
    # weights_only=False: the checkpoint holds RNG states (numpy arrays) written by this code
    return torch.load(path, map_location=map_location, weights_only=False)


def rng_state() -> Dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
