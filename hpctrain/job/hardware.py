"""What an attempt ran on: its node(s), GPU model, driver and CUDA versions, CPU model, read once at its start.

:func:`probe` answers a flat dict (the ``hardware`` of the attempt's ``started`` event and of metrics.json)::

    node         Slurm's name for this node (SLURMD_NODENAME), else the host name
    host         the host name (socket.gethostname())
    nodelist     the job's nodes as Slurm writes them (SLURM_JOB_NODELIST, ``n[1-2]``); None outside Slurm
    cpu_model    /proc/cpuinfo's "model name" (or "Hardware", "cpu model")
    gpu_model    NVML's name of the GPU(s) this process sees (CUDA_VISIBLE_DEVICES), several joined by " + "
    gpu_count    how many it sees
    driver       NVML's driver version
    cuda_driver  the CUDA version the driver supports (NVML)
    cuda         the CUDA torch was built with (torch.version.cuda; read from its file when torch is not imported)
    absent       {field: why} for each field above that could not be read (no NVML, a CPU-only torch, ...)

Never raises: a field that cannot be read is None and says why in ``absent``. No torch import here (the
login side reads what this wrote; torch costs seconds to import and is read from its version file instead).
"""

import importlib.util
import os
import re
import socket
import sys
from typing import Any, Dict, List, Optional

FIELDS = ("node", "host", "nodelist", "cpu_model", "gpu_model", "gpu_count", "driver", "cuda_driver", "cuda")


def visible_handles(nvml: Any, empty_is_all: bool = False) -> List[Any]:
    """NVML handles of the GPUs this process sees (CUDA_VISIBLE_DEVICES as indexes or UUIDs; unset: all; empty:
    none, as CUDA reads it, or all with ``empty_is_all``, as the sampler always has)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    given = visible is not None and (visible.strip() != "" or not empty_is_all)
    wanted = [v.strip() for v in (visible or "").split(",") if v.strip()] if given else None
    handles = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        if wanted is None or str(i) in wanted or uuid in wanted:
            handles.append(handle)
    return handles


def probe() -> Dict[str, Any]:
    """This process's hardware facts (see the module doc)."""
    absent: Dict[str, str] = {}
    host = socket.gethostname()
    node = os.environ.get("SLURMD_NODENAME") or host
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or None
    out: Dict[str, Any] = {"node": node, "host": host, "nodelist": nodelist, "cpu_model": cpu_model()}
    if out["cpu_model"] is None:
        absent["cpu_model"] = "no model name in /proc/cpuinfo"
    out.update(_nvml(absent))
    out["cuda"], why = torch_cuda()
    if why:
        absent["cuda"] = why
    out["absent"] = absent
    return out


def cpu_model(path: str = "/proc/cpuinfo") -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(65536)  # the first processor's block is enough
    except OSError:
        return None
    for key in ("model name", "Hardware", "cpu model", "Processor"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m and m.group(1).strip():
            return " ".join(m.group(1).split())
    return None


def _nvml(absent: Dict[str, str]) -> Dict[str, Any]:
    """GPU model, count, driver and the driver's CUDA version from NVML; None (and why) for each unread."""
    out: Dict[str, Any] = {"gpu_model": None, "gpu_count": 0, "driver": None, "cuda_driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no library, no driver: a CPU node
        why = f"no NVML ({_short(exc)})"
        absent.update(gpu_model=why, driver=why, cuda_driver=why)
        return out
    try:
        handles = visible_handles(pynvml)
        names = sorted({_text(pynvml.nvmlDeviceGetName(h)) for h in handles})
        out["gpu_count"], out["gpu_model"] = len(handles), " + ".join(names) or None
        if not handles:
            absent["gpu_model"] = "NVML sees no GPU for this process (CUDA_VISIBLE_DEVICES)"
    except Exception as exc:  # noqa: BLE001 - a half-working driver: what was read stands
        absent["gpu_model"] = f"NVML: {_short(exc)}"
    try:
        out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
    except Exception as exc:  # noqa: BLE001
        absent["driver"] = f"NVML: {_short(exc)}"
    try:
        version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}"
    except Exception as exc:  # noqa: BLE001
        absent["cuda_driver"] = f"NVML: {_short(exc)}"
    try:
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - the sampler keeps its own init
        pass
    return out


def torch_cuda() -> "tuple[Optional[str], str]":
    """(torch.version.cuda, why it is None): from the imported torch, else from its version file."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "version", None) is not None:
        cuda = getattr(torch.version, "cuda", None)
        return (str(cuda), "") if cuda else (None, "torch is built without CUDA")
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, "torch is not installed"
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    try:
        with open(path, encoding="utf-8") as f:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", f.read(), re.MULTILINE)
    except OSError:
        return None, f"cannot read {path}"
    value = m.group(1).strip().strip("'\"") if m else "None"
    return (value, "") if value not in ("None", "") else (None, "torch is built without CUDA")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _short(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]


def node_of(run_dir: "os.PathLike[str] | str", rank: int, me: int) -> str:
    """The node ``rank`` of this attempt runs on: this process's own (rank ``me``) for itself, else the rank's
    hardware file (written at its start, :mod:`hpctrain.job.lifecycle`) when it is this attempt's; "" when
    unknown."""
    from pathlib import Path

    from hpctrain.core.atomic import read_json
    from hpctrain.core.events import slurm_key
    from hpctrain.core.paths import RunPaths

    if rank == me:
        return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    facts = read_json(RunPaths(Path(run_dir)).hardware / f"rank-{rank}.json") or {}
    if facts.get("key") != slurm_key():
        return ""
    return str(facts.get("node") or facts.get("host") or "")
