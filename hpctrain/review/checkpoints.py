"""A run's newest complete checkpoint, found without torch (the login side never imports it).

The trainer's rule (:mod:`hpctrain.train.checkpointer`): ``checkpoints/last.pt``, else ``previous.pt``; a
file counts once complete. ``torch.save`` writes a zip whose central directory comes last, so a torn
(truncated) file has none; the pickled top level must hold the ``step`` key the trainer's loader requires.
"""

import pickletools
import zipfile
from pathlib import Path
from typing import Optional

from hpctrain.core import paths as runfiles


def newest_complete(run_dir: Optional[Path]) -> Optional[Path]:
    """``last.pt``, else ``previous.pt``, whichever is complete first; None when neither is."""
    if run_dir is None:
        return None
    last = Path(run_dir) / runfiles.CKPT
    for candidate in (last, last.with_name(runfiles.PREVIOUS_CKPT)):
        if is_complete(candidate):
            return candidate
    return None


def is_complete(path: Path) -> bool:
    """A readable torch zip with a ``step`` in its pickled top level (what ``checkpointer.load`` accepts)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickled) != 1:
                return False
            data = archive.read(pickled[0])
        return any(arg == "step" for _, arg, _ in pickletools.genops(data))
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, KeyError):
        return False
