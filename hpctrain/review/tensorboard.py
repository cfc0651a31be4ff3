"""``hpctrain tensorboard``: TensorBoard over the sweep, each run named by its swept values.

Run dir names can hold commas (Hydra joins overrides with them), which ``--logdir_spec`` cannot take,
so the runs are presented as a folder of symlinks named by their values (``lr=0.001,seed=1``) pointing
at each run's ``tb/``; links of runs not started yet dangle until their run writes its first event.
TensorBoard runs as a child process (:mod:`hpctrain.review.tensorboard_server`, with the ``hpctrain`` tab)
bound to 127.0.0.1 unless ``--host`` says otherwise, behind a random token: every user of a login node can
reach its 127.0.0.1. The token and the session's path go to the child through a pipe (not argv: ``ps``
shows argv to all); the URL is printed only once the child says it has bound the port (a user who took the
port first answers on it, but never says so), and the cookie works on this server alone
(:mod:`hpctrain.review.token_gate`).
"""

import getpass
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import quote

from hpctrain.core import stopping, summary
from hpctrain.core.paths import RunPaths, SweepPaths
from hpctrain.review import fmt
from hpctrain.review.sweep import SweepListing, load_sweep
from hpctrain.review.token_gate import BOUND, SESSION_STDIN

START_TIMEOUT_S = 90.0


def run_names(sweep: SweepListing) -> Dict[str, Path]:
    """``{"lr=0.001": <run_dir>/tb}``; names made unique with the run index where values repeat."""
    out: Dict[str, Path] = {}
    for spec in sweep.runs:
        if spec.run_dir is None:
            continue
        name = re.sub(r"[/\\:]+", "_", fmt.label(sweep.values(spec), spec.overrides, sep=","))
        if name in out:
            name = f"{name} #{spec.idx}"
        out[name] = RunPaths(spec.run_dir).tb
    return out


def make_links(sweep: SweepListing) -> Path:
    """The folder TensorBoard reads: one symlink per run; in the sweep dir, else (read-only) a temp dir."""
    names = run_names(sweep)
    try:
        folder = SweepPaths(sweep.dir).tensorboard_links
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    except OSError:
        folder = Path(tempfile.mkdtemp(prefix="hpctrain-tb-"))
    for name, target in names.items():
        (folder / name).symlink_to(target.absolute(), target_is_directory=True)
    return folder


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str, first: int = 6006, tries: int = 100) -> int:
    for port in range(first, first + tries):
        if port_free(host, port):
            return port
    raise OSError(f"no free port in {first}..{first + tries - 1} on {host}; pass --port")


def _bound(ready: int, proc: subprocess.Popen, deadline: float) -> bool:
    """Whether the child wrote ``bound`` on its descriptor (its server holds the port) before it exited or
    the deadline passed."""
    got = b""
    while time.time() < deadline:
        readable, _, _ = select.select([ready], [], [], 0.3)
        if readable:
            chunk = os.read(ready, 64)
            got += chunk
            if got.startswith(BOUND):
                return True
            if not chunk:
                return False  # closed without a word: the child is gone, or never bound
        elif proc.poll() is not None:
            return False
    return False


def login_host() -> str:
    """This machine's name as users reach it by ssh (the FQDN unless it is only localhost)."""
    fqdn = socket.getfqdn()
    return socket.gethostname() if not fqdn or fqdn.startswith("localhost") else fqdn


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


NO_TOKEN_WARNING = ("hpctrain tensorboard: warning: --no-token: anyone who can reach {where} (on a shared login "
                    "node: every user logged in there) can read this sweep's runs, logs and configs")


def objective_tag(sweep: SweepListing) -> Optional[str]:
    """The metric the sweep is ranked by: a search's, else the first run's declared objective."""
    if sweep.objective_metric and sweep.objective_metric != "value":
        return sweep.objective_metric
    for run in sweep.runs[:20]:  # a few runs: the objective is the same in every run of a sweep
        declared = (summary.read(run.run_dir) or {}).get("objective") if run.run_dir else None
        if isinstance(declared, dict) and isinstance(declared.get("metric"), str):
            return declared["metric"]
    return None


def pinned_cards(sweep: SweepListing) -> str:
    """``&pinnedCards=...`` for the URL: the Time Series tab shows the objective and the losses first (it
    sorts its own groups by name, so ``perf/`` and ``sys/`` would come before ``train/`` and ``val/``)."""
    tags = list(dict.fromkeys(t for t in (objective_tag(sweep), "train/loss", "val/loss") if t))
    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    return "pinnedCards=" + quote(cards, safe="")


def server_command(links: Path, sweep_dir: Path, host: str, port: int) -> List[str]:
    # --load_fast=false: TensorBoard's data server would listen on a second, ungated local port
    return [sys.executable, "-m", "hpctrain.review.tensorboard_server", SESSION_STDIN,
            "--logdir", str(links), "--host", host, "--port", str(port), "--reload_interval", "15",
            "--load_fast", "false", "--hpctrain_sweep_dir", str(sweep_dir)]


def run(sweep_dir: Path, port: Optional[int] = None, host: str = "127.0.0.1", token: bool = True) -> int:
    try:
        sweep = load_sweep(sweep_dir)
    except OSError as exc:
        print(f"hpctrain tensorboard: error: {sweep_dir}: cannot be read ({exc.strerror or exc})", file=sys.stderr)
        return 2
    if port is None:
        port = pick_port(host)
    elif not port_free(host, port):
        print(f"hpctrain tensorboard: error: port {port} on {host} is in use; pick another with --port", file=sys.stderr)
        return 2
    links = make_links(sweep)
    cmd = server_command(links, sweep_dir, host, port)
    secret = secrets.token_urlsafe(32) if token else ""
    prefix = f"/s/{secrets.token_urlsafe(12)}" if token else ""  # the session's own path: the cookie's Path
    loopback = host in ("localhost", "127.0.0.1")
    names = [] if loopback else [login_host(), socket.gethostname(), socket.getfqdn()]
    ready, bound_fd = os.pipe()
    session = {"token": secret, "prefix": prefix, "bound_fd": bound_fd, "hosts": names, "pinned": pinned_cards(sweep)}
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(bound_fd,))
    finally:
        os.close(bound_fd)
    assert proc.stdin is not None
    try:
        proc.stdin.write((json.dumps(session) + "\n").encode())
        proc.stdin.close()
    except OSError:
        pass  # the child died at once: reported below with its exit code
    signal.signal(signal.SIGTERM, _on_sigterm)  # `kill` stops TensorBoard too
    try:
        if not _bound(ready, proc, time.time() + START_TIMEOUT_S):
            if proc.poll() is not None:
                print(f"hpctrain tensorboard: error: TensorBoard exited with code {proc.returncode} "
                      f"(command: {' '.join(cmd)})", file=sys.stderr)
            else:
                print(f"hpctrain tensorboard: error: TensorBoard did not bind {host}:{port} "
                      f"within {START_TIMEOUT_S:.0f} s", file=sys.stderr)
            return 1
        shown = login_host() if host in ("0.0.0.0", "") else host
        print(f"\nTensorBoard on {sweep_dir}: {len(run_names(sweep))} runs, named by "
              f"{', '.join(sweep.swept) or 'their overrides'}")
        query = f"?token={secret}&{pinned_cards(sweep)}" if secret else f"?{pinned_cards(sweep)}"
        query = f"{prefix}/{query}"
        print(f"  URL:        http://{shown}:{port}{query}")
        target = "127.0.0.1" if host in ("0.0.0.0", "", "localhost", "127.0.0.1") else host
        print(f"  ssh tunnel: ssh -N -L {port}:{target}:{port} {getpass.getuser()}@{login_host()}"
              f"   (then open http://localhost:{port}{query} on your machine)")
        print("  The hpctrain tab: every run's state, the queue, failed runs' errors; it refreshes by itself.")
        print("  Ctrl-C to stop.", flush=True)
        if not secret:
            print(NO_TOKEN_WARNING.format(where=f"{host}:{port}"), file=sys.stderr, flush=True)
        return proc.wait()
    finally:
        os.close(ready)
        stopping.end_child(proc, grace_s=10)
        if not str(links).startswith(str(sweep.dir)):
            shutil.rmtree(links, ignore_errors=True)
