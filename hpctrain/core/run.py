"""A run's identity: decided once on the login node, handed down unchanged, in one serialized form.

The launcher plans it, sweep.json stores it, the job receives it and sets Hydra's output dir from it,
and review reads it back: nothing below the plan recomputes a run's directory or name.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

PathLike = Union[str, Path]


@dataclass(frozen=True)
class RunSpec:
    idx: int  # the sweep point's number (Hydra's job num)
    overrides: Tuple[str, ...]  # the point's own overrides, as Hydra gives them
    run_dir: Path  # absolute
    max_steps: Optional[int] = None  # the run's step budget where the app has one (progress in status)

    @property
    def name(self) -> str:
        return self.run_dir.name

    def values(self) -> Dict[str, str]:
        """The point's keys (``+``, ``~`` and ``@pkg`` left off) and their values as written, read as text: no
        parser, since sweep.json keeps a secret's value as ``<redacted>``, which Hydra's grammar refuses."""
        out: Dict[str, str] = {}
        for line in self.overrides:
            key, sep, value = line.partition("=")
            if sep and not key.startswith("~"):
                out[key.strip().lstrip("+").split("@", 1)[0]] = value
        return out

    def to_json(self, sweep_dir: PathLike) -> Dict[str, Any]:
        """The one serialized form; ``run_dir`` relative to the sweep dir (a moved sweep dir still reads)."""
        return {"idx": self.idx, "overrides": list(self.overrides),
                "run_dir": relative(str(self.run_dir), str(sweep_dir)), "max_steps": self.max_steps}

    @classmethod
    def from_json(cls, data: Dict[str, Any], sweep_dir: PathLike) -> "RunSpec":
        steps = data.get("max_steps")
        run_dir = os.path.join(sweep_dir, str(data["run_dir"]))  # one Path parse: 10,000 runs are read at once
        return cls(idx=int(data["idx"]), overrides=tuple(str(o) for o in data.get("overrides") or ()),
                   run_dir=Path(run_dir if os.path.isabs(run_dir) else os.path.join(os.getcwd(), run_dir)),
                   max_steps=int(steps) if isinstance(steps, (int, float)) and not isinstance(steps, bool) else None)


def relative(path: str, base: str) -> str:
    """``os.path.relpath(path, base)``; a plain slice for a path under an absolute ``base`` (a sweep's run dirs:
    relpath costs ~25 us, which 10,000 runs feel on every write of sweep.json)."""
    prefix = base + os.sep
    if os.path.isabs(base) and not base.endswith(os.sep) and path.startswith(prefix):
        tail = path[len(prefix):]
        if all(part not in ("", ".", "..") for part in tail.split(os.sep)):
            return tail
    return os.path.relpath(path, base)
