"""The files of a run directory and of a sweep directory, and atomic JSON writes.

Shared by both wings (trainer and login-node commands): no torch here.
"""

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

METRICS = "metrics.json"
PACKED_LOG = os.path.join(".hpctrain", "task.log")  # a packed run's own output, under its run dir
PACKED_CANCELLED = "cancelled (its record says so)"  # the task's note in that log when it stopped the run
TB_DIR = "tb"
CKPT = Path("checkpoints") / "last.pt"
HYDRA_DIR = ".hydra"
SWEEP_MANIFEST = "sweep.json"  # written by the launcher into the sweep dir
SUBMITIT_DIR = ".submitit"

_UMASK = os.umask(0)
os.umask(_UMASK)
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)
_ENV_REF = re.compile(r"oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")


def looks_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redacted(cfg: Any) -> Dict[str, Any]:
    """The resolved config as plain data, for copies the run keeps (checkpoint, TensorBoard hparams),
    with secrets left out: values of secret-looking keys, and values read from secret-looking
    environment variables (``${oc.env:HF_TOKEN}``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True)

    def walk(r: Any, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: "<redacted>" if looks_secret(str(k)) else walk(r.get(k) if isinstance(r, dict) else None, x)
                    for k, x in v.items()}
        if isinstance(v, list):
            return [walk(r[i] if isinstance(r, list) and i < len(r) else None, x) for i, x in enumerate(v)]
        if isinstance(r, str) and any(looks_secret(name) for name in _ENV_REF.findall(r)):
            return "<redacted>"
        return v

    return walk(raw, resolved)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """The one temp-file-and-rename: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; others on the shared storage may read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str))


def read_json(path: "str | Path") -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_metrics(run_dir: Path) -> Optional[Dict[str, Any]]:
    return read_json(Path(run_dir) / METRICS)


def read_manifest(sweep_dir: Path) -> Optional[Dict[str, Any]]:
    return read_json(Path(sweep_dir) / SWEEP_MANIFEST)
