"""Scalar curves of a run, read with TensorBoard's own reader (its EventAccumulator), never by hand."""

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from hpctrain import runfiles

Curve = List[Tuple[int, float]]  # (step, value)


def read_scalars(run_dir: Optional[str], tags: Iterable[str]) -> Dict[str, Curve]:
    """``{tag: [(step, value), ...]}`` for those of ``tags`` the run's ``tb/`` holds; {} without events."""
    if not run_dir:
        return {}
    tb_dir = Path(run_dir) / runfiles.TB_DIR
    if not tb_dir.is_dir() or not any(p.name.startswith("events.out.tfevents") for p in tb_dir.iterdir()):
        return {}
    from tensorboard.backend.event_processing import event_accumulator as ea

    # keep every scalar; load as little as possible of the other kinds
    guidance = {ea.SCALARS: 0, ea.TENSORS: 1, ea.HISTOGRAMS: 1, ea.COMPRESSED_HISTOGRAMS: 1, ea.IMAGES: 1, ea.AUDIO: 1}
    acc = ea.EventAccumulator(str(tb_dir), size_guidance=guidance)
    try:
        acc.Reload()
    except Exception:  # noqa: BLE001 - a truncated event file (a run killed mid-write) is not fatal
        return {}
    have = set(acc.Tags().get("scalars", []))
    return {tag: [(int(e.step), float(e.value)) for e in acc.Scalars(tag)] for tag in tags if tag in have}


def scalar_tags(run_dir: Optional[str]) -> List[str]:
    if not run_dir or not (Path(run_dir) / runfiles.TB_DIR).is_dir():
        return []
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(Path(run_dir) / runfiles.TB_DIR), size_guidance={ea.SCALARS: 1})
    try:
        acc.Reload()
    except Exception:  # noqa: BLE001
        return []
    return sorted(acc.Tags().get("scalars", []))
