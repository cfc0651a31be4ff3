"""The files of a run directory and of a sweep directory, and atomic JSON writes.

Shared by both wings (trainer and login-node commands): no torch here.
"""

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional

METRICS = "metrics.json"
TB_DIR = "tb"
CKPT = Path("checkpoints") / "last.pt"
HYDRA_DIR = ".hydra"
SWEEP_MANIFEST = "sweep.json"  # written by the launcher into the sweep dir
SUBMITIT_DIR = ".submitit"

# Run states written to metrics.json ("pending" and "cancelled" are only ever derived by `status`).
RUNNING, COMPLETED, FAILED = "running", "completed", "failed"
REQUEUED, RETRYING = "requeued", "retrying"  # checkpointed for a requeue / crashed, retry queued

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


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; others on the shared storage may read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: "str | Path") -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_metrics(run_dir: Path) -> Optional[Dict[str, Any]]:
    return read_json(Path(run_dir) / METRICS)


def update_metrics(run_dir: Path, **fields: Any) -> Dict[str, Any]:
    """Merge ``fields`` into the run's metrics.json (atomically) and return the new record."""
    path = Path(run_dir) / METRICS
    record = read_json(path) or {}
    record.update(fields)
    record["updated"] = time.time()
    write_json_atomic(path, record)
    return record


def is_completed(run_dir: Path) -> bool:
    record = read_metrics(run_dir)
    return bool(record) and record.get("status") == COMPLETED


# ---------------------------------------------------------------- sweep-level files (launcher-owned)
def events_path(sweep_dir: "str | Path", idx: int) -> str:
    # plain strings, not pathlib: `status` reads one of these per run (1000s)
    return os.path.join(sweep_dir, ".hpctrain", "events", f"{idx}.jsonl")


def append_event(sweep_dir: Path, idx: int, kind: str, **fields: Any) -> None:
    """One line per attempt's start, failure or retry: how `status` counts restarts."""
    path = events_path(sweep_dir, idx)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"event": kind, "time": time.time(), **fields}, default=str) + "\n")


def read_events(sweep_dir: "str | Path", idx: int) -> list:
    try:
        with open(events_path(sweep_dir, idx)) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def read_manifest(sweep_dir: Path) -> Optional[Dict[str, Any]]:
    return read_json(Path(sweep_dir) / SWEEP_MANIFEST)
