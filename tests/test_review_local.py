"""The review commands on a real local sweep: status, report (and its best command, rerun), tensorboard
over HTTP, a 1000-run status under 2 s, cancel of a local sweep in flight, and no torch on the way.
"""

import json
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import HELPERS, ROOT, hpctrain_env, run_hpctrain

TESTS = ROOT / "tests"
LRS = ["0.03", "0.01", "0.001", "0.3"]  # 0.3 fails on purpose (test_review_helpers.LrBoom)


def env() -> dict:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), str(HELPERS), os.environ.get("PYTHONPATH")]))}


def review(args, cwd, extra_flags=()) -> subprocess.CompletedProcess:
    """A review command as a user runs it, in a fresh interpreter, output piped."""
    return subprocess.run([sys.executable, *extra_flags, "-m", "hpctrain", *args], cwd=cwd, env=hpctrain_env(env()),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("review")
    sweep_dir = work / "sweep"
    proc = run_hpctrain(["-m", f"lr={','.join(LRS)}", "max_steps=30", "model._target_=test_review_helpers.LrBoom",
                         "+model.boom_lr=0.3", "hydra/launcher=local", "hydra.launcher.max_retries=1",
                         "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={sweep_dir}"], cwd=work, env=env(), check=False)
    assert proc.returncode != 0, "one run fails on purpose: the local launcher exits non-zero"
    return sweep_dir


def metrics_of(sweep_dir: Path) -> dict:
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    return {int(i): json.loads((sweep_dir / r["run_dir"] / "metrics.json").read_text())
            for i, r in manifest["runs"].items()}


def test_status_rows_and_counts(sweep):
    proc = review(["status", str(sweep)], cwd=sweep.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a run failed
    lines = proc.stdout.splitlines()
    rows = {int(line.split()[0]): line for line in lines if re.match(r"\s*\d+\s+lr=", line)}
    assert sorted(rows) == [0, 1, 2, 3]
    for idx, lr in enumerate(LRS):
        assert f"lr={lr} " in rows[idx]
        assert (" failed " if lr == "0.3" else " completed ") in rows[idx]
        assert ("30/30" in rows[idx]) == (lr != "0.3")
    assert lines[-1] == "4 runs: 3 completed, 1 failed"
    assert any("#3 failed" in line and "LrBoom: this run fails on purpose" in line for line in lines)

    records = {r["idx"]: r for r in json.loads(review(["status", str(sweep), "--json"], cwd=sweep.parent).stdout)["runs"]}
    truth = metrics_of(sweep)
    for idx, rec in records.items():
        assert rec["values"] == {"lr": LRS[idx]}
        assert Path(rec["log"]).is_file()
        if idx == 3:
            assert rec["state"] == "failed" and rec["restarts"] == 1  # max_retries=1: a second attempt
            assert rec["log"].endswith("_log.err") and "LrBoom" in Path(rec["log"]).read_text()
            assert "RuntimeError: LrBoom" in rec["error"]
        else:
            assert rec["state"] == "completed" and rec["restarts"] == 0
            assert rec["step"] == rec["max_steps"] == 30
            assert rec["loss"] == truth[idx]["metrics"]["train/loss"]
            assert rec["elapsed_s"] == pytest.approx(truth[idx]["elapsed_s"])


def _png_size(path: Path) -> tuple:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_best_run_files_and_plots(sweep):
    truth = metrics_of(sweep)
    val = {i: m["metrics"]["val/loss"] for i, m in truth.items() if m["status"] == "completed"}
    best = min(val, key=val.get)

    proc = review(["report", str(sweep)], cwd=sweep.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "ranked by val/loss (min, the objective)" in out  # the sweep's objective: the default metric
    assert f"best: #{best} lr={LRS[best]}" in out
    assert "RuntimeError: LrBoom: this run fails on purpose" in out  # the failed run's error, in the report
    result = json.loads((sweep / "results.json").read_text())
    assert result["metric"] == "val/loss" and result["best"]["idx"] == best
    assert result["best"]["value"] == val[best]
    assert f"reproduce: {result['best']['command']}" in out
    assert sorted(r["idx"] for r in result["runs"]) == [0, 1, 2, 3]
    assert [r["idx"] for r in result["runs"]][:3] == sorted(val, key=val.get)  # ranked, failed run last

    import csv

    with open(sweep / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(int(r["idx"]) for r in rows) == [0, 1, 2, 3]
    for r in rows:
        assert r["lr"] == LRS[int(r["idx"])]
        if r["state"] == "completed":
            assert float(r["val/loss"]) == val[int(r["idx"])]
        else:
            assert r["state"] == "failed" and r["val/loss"] == "" and "LrBoom" in r["error"]

    md = (sweep / "report.md").read_text()
    assert result["best"]["command"] in md and "## Failed runs" in md and "LrBoom" in md
    from matplotlib import image

    for name in ("loss_curves.png", "metric_vs_lr.png"):
        path = sweep / name
        assert f"![{path.stem}]({name})" in md
        width, height = _png_size(path)
        assert 600 <= width <= 3000 and 400 <= height <= 2000, (name, width, height)
        assert path.stat().st_size > 15_000, name  # drawn, not blank
        pixels = image.imread(path)
        assert pixels.shape[:2] == (height, width) and pixels[..., :3].std() > 0.05, name


def test_report_metric_and_mode_options(sweep):
    proc = review(["report", str(sweep), "--metric", "train/loss", "--mode", "max"], cwd=sweep.parent)
    assert proc.returncode == 0, proc.stderr
    truth = metrics_of(sweep)
    losses = {i: m["metrics"]["train/loss"] for i, m in truth.items() if m["status"] == "completed"}
    # ranked otherwise than by default: its files beside the default report's, named by the metric and mode
    assert json.loads((sweep / "results-by-train_loss-max.json").read_text())["best"]["idx"] == max(losses, key=losses.get)
    assert json.loads((sweep / "results.json").read_text())["metric"] == "val/loss"
    bad = review(["report", str(sweep), "--metric", "val/acc"], cwd=sweep.parent)
    assert bad.returncode == 2 and "'val/acc'" in bad.stderr and "available: " in bad.stderr and "val/loss" in bad.stderr


def test_best_command_reproduces_the_best_run(sweep, tmp_path):
    proc = review(["report", str(sweep)], cwd=sweep.parent)  # its own report: no file of another test
    assert proc.returncode == 0, proc.stderr
    best = json.loads((sweep / "results.json").read_text())["best"]
    words = shlex.split(best["command"])
    if "&&" in words:
        cwd, words = Path(words[1]), words[words.index("&&") + 1:]
        assert cwd == sweep.parent  # where the sweep was started
    # the sweep's interpreter, with the code snapshot of its submission first on PYTHONPATH
    assert words[words.index("-m") - 1:words.index("-m") + 2] == [sys.executable, "-m", "hpctrain"]
    (path,) = [w[len("PYTHONPATH="):] for w in words if w.startswith("PYTHONPATH=")]
    assert str(sweep / ".hpctrain" / "submission-0" / "code") + str(ROOT) in path
    run_dir = tmp_path / "again"
    proc = subprocess.run(["bash", "-c", f"{best['command']} hydra.run.dir={shlex.quote(str(run_dir))}"],
                          cwd=sweep.parent, env=hpctrain_env(env()), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads((run_dir / "metrics.json").read_text())
    assert again["status"] == "completed"
    assert again["metrics"]["val/loss"] == pytest.approx(best["value"], rel=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, opener=None):
    with (opener.open if opener else urllib.request.urlopen)(url, timeout=10) as r:
        return json.loads(r.read())


def _opener_with_cookie(url_with_token: str) -> urllib.request.OpenerDirector:
    """An opener that has visited the printed URL once: later requests go in with the cookie it was given."""
    import http.cookiejar

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    deadline = time.time() + 60
    while True:
        try:
            opener.open(url_with_token, timeout=10).read()
            return opener
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_tensorboard_serves_every_run_by_its_values(sweep):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "hpctrain", "tensorboard", str(sweep),
                             "--port", str(port)], cwd=sweep.parent, env=hpctrain_env(env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    expected = {f"lr={lr}" for lr in LRS}
    printed = []
    try:
        while not any("Ctrl-C to stop" in line for line in printed):  # printed once TensorBoard answers
            line = proc.stdout.readline()
            assert line, proc.communicate()
            printed.append(line)
        url = next(line.split()[-1] for line in printed if "URL:" in line)
        base = url.split("?")[0].rstrip("/")  # the session's own path (token_gate.py)
        opener = _opener_with_cookie(url)  # the token once, then its cookie
        deadline, runs = time.time() + 120, []
        while time.time() < deadline and set(runs) != expected:
            assert proc.poll() is None, proc.communicate()
            try:
                runs = _get_json(f"{base}/data/runs", opener)
            except OSError:
                pass
            time.sleep(0.5)
        assert set(runs) == expected
        truth = metrics_of(sweep)
        for idx, lr in enumerate(LRS[:3]):
            query = urllib.parse.urlencode({"run": f"lr={lr}", "tag": "train/loss"})
            points = _get_json(f"{base}/data/plugin/scalars/scalars?{query}", opener)
            assert [p[1] for p in points] == [10, 20, 30]  # (wall time, step, value), log_every=10
            assert points[-1][2] == pytest.approx(truth[idx]["metrics"]["train/loss"], rel=1e-5, abs=1e-7)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        out = "".join(printed) + out
    assert f"URL:        http://127.0.0.1:{port}/" in out
    assert re.search(rf"ssh -N -L {port}:127\.0\.0\.1:{port} \S+@\S+", out)
    # TensorBoard stopped with the command: nothing listens on its port (the bind a server makes, with
    # SO_REUSEADDR: the closed connections' TIME_WAIT sockets on that port do not count)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    assert not _imported(err, "torch")


def _imported(importtime_stderr: str, package: str) -> list:
    return [line for line in importtime_stderr.splitlines()
            if re.search(rf"\|\s+{re.escape(package)}(\.|$)", line.rstrip())]


def test_login_node_commands_never_import_torch(sweep):
    for args in (["status"], ["report"], ["cancel"]):
        proc = review(args + [str(sweep)], cwd=sweep.parent, extra_flags=("-X", "importtime"))
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        assert not _imported(proc.stderr, "torch"), args
        if args == ["status"]:  # status stays light: no plotting, no TensorBoard
            assert not _imported(proc.stderr, "matplotlib") and not _imported(proc.stderr, "tensorboard")


def test_status_of_1000_runs_lists_and_counts_every_one(sweep, tmp_path):
    """The scale's correctness; its speed is measured by benchmarks/status_1000.py, not timed here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from status_1000 import build_sweep
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    big = build_sweep(sweep, tmp_path / "big", 1000)
    stubs = tmp_path / "bin"  # the queue and accounting know none of its jobs (as the test cluster answers for
    stubs.mkdir()  # ids it never reached): the same answer with no Slurm running, so the fast tier needs none
    for tool in ("squeue", "sacct"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    proc = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(big)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env=hpctrain_env({**env(), "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}))
    assert proc.returncode == 1, proc.stderr  # one run in ten failed
    rows = [line for line in proc.stdout.splitlines() if re.match(r"\s*\d+\s+lr=", line)]
    assert len(rows) == 1000
    assert proc.stdout.splitlines()[-1] == "1000 runs: 750 completed, 200 failed, 50 cancelled"


def _processes_mentioning(text: str) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd:
                found.append((int(entry.name), cmd))
    return found


def endless_local_sweep(sweep_dir: Path, cwd: Path) -> subprocess.Popen:
    """Three runs that never end on their own, one at a time, on the local launcher (in its own session)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "-m", "lr=0.01,0.001,0.0001", "max_steps=1000000", "hydra/launcher=local",
         "hydra.launcher.max_parallel=1", f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd, env=hpctrain_env(env()), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)


def _status(sweep_dir: Path, cwd: Path) -> list:
    proc = review(["status", str(sweep_dir), "--json"], cwd=cwd)
    return json.loads(proc.stdout)["runs"] if proc.returncode == 0 and proc.stdout.strip() else []


def test_local_sweep_in_flight_status_cancel_one_run_then_the_sweep(tmp_path):
    """status of a sweep in flight; `cancel --run N`: a pending run is refused, the running one stops and
    the next starts; then `cancel` of the whole sweep ends the launcher and `status --watch` with it."""
    sweep_dir = tmp_path / "inflight"
    launcher = endless_local_sweep(sweep_dir, tmp_path)
    try:
        deadline, runs = time.time() + 180, []
        while time.time() < deadline and not ([r["state"] for r in runs] == ["running", "queued", "queued"]
                                              and (runs[0]["step"] or 0) > 0):
            assert launcher.poll() is None, launcher.communicate()[0]
            time.sleep(1)
            runs = _status(sweep_dir, tmp_path) if (sweep_dir / "sweep.json").exists() else []
        assert [r["state"] for r in runs] == ["running", "queued", "queued"]
        table = review(["status", str(sweep_dir)], cwd=tmp_path)
        assert table.stdout.splitlines()[-1] == "3 runs: 2 queued, 1 running"
        # the launcher records the sweep (and its own pid) before the first run starts
        manifest = json.loads((sweep_dir / "sweep.json").read_text())
        assert manifest["launcher_pid"] == launcher.pid and sorted(manifest["runs"]) == ["0", "1", "2"]

        pending = review(["cancel", str(sweep_dir), "--run", "2"], cwd=tmp_path)
        assert pending.returncode == 2 and "cancel the whole sweep" in pending.stderr, pending.stderr
        assert [r["state"] for r in _status(sweep_dir, tmp_path)][1:] == ["queued", "queued"]  # nothing changed

        running = review(["cancel", str(sweep_dir), "--run", "0"], cwd=tmp_path)
        assert running.returncode == 0, running.stdout + running.stderr
        assert "#0 lr=0.01: was running, cancelled" in running.stdout
        wait = time.time() + 120
        while time.time() < wait and [r["state"] for r in _status(sweep_dir, tmp_path)] != \
                ["cancelled", "running", "queued"]:
            time.sleep(1)
        assert [r["state"] for r in _status(sweep_dir, tmp_path)] == ["cancelled", "running", "queued"]
        assert launcher.poll() is None  # the sweep goes on with its next run

        watcher = subprocess.Popen([sys.executable, "-m", "hpctrain", "status", str(sweep_dir), "--watch",
                                    "--interval", "1"], cwd=tmp_path, env=hpctrain_env(env()),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = watcher.stdout.readline()  # it watches the sweep in flight before the cancel
        assert "refreshing every 1s" in first, first
        proc = review(["cancel", str(sweep_dir)], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.splitlines()[-1] == "3 runs: 3 cancelled"
        launcher.wait(timeout=30)  # the launcher was stopped too: it starts no further run
        watched, _ = watcher.communicate(timeout=60)  # --watch ends by itself once no run is active
        assert watcher.returncode == 0 and watched.count("refreshing every 1s") >= 1
        assert watched.splitlines()[-1] == "3 runs: 3 cancelled"
        after = review(["status", str(sweep_dir)], cwd=tmp_path)
        assert after.returncode == 0 and after.stdout.splitlines()[-1] == "3 runs: 3 cancelled"
        time.sleep(1)
        assert not _processes_mentioning(str(sweep_dir)), "a process of the cancelled sweep is still running"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)  # our own session only
        for pid, _ in _processes_mentioning(str(sweep_dir)):
            os.kill(pid, signal.SIGKILL)


def test_tensorboard_refuses_a_taken_port_and_picks_the_next_free_one(sweep):
    from hpctrain.review.tensorboard import pick_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.time()
        proc = review(["tensorboard", str(sweep), "--port", str(port)], cwd=sweep.parent)
        assert proc.returncode == 2 and time.time() - start < 60, proc.stdout + proc.stderr
        assert f"port {port} on 127.0.0.1 is in use; pick another with --port" in proc.stderr
        assert "Traceback" not in proc.stderr
        # without --port: the first free one from the default on, never the taken one
        assert pick_port("127.0.0.1", first=port) != port
