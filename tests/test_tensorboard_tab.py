"""``hpctrain tensorboard`` in a real browser (Playwright driving Debian's Chromium) on a real local sweep:
the hpctrain tab shows every run's state and a failed run's error, follows state changes on disk within
5 s, says what it could not read; HParams still lists the swept keys first; without the token every
request is refused (403), with it the cookie lets later requests in. Screenshots of each check are kept
in the test's tmp dir.
"""

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import HELPERS, ROOT, hpctrain_env, run_hpctrain

CHROMIUM = "/usr/bin/chromium"
# no downloads here: without the networking flags Chromium keeps dialling out
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
LRS = ["0.01", "0.001", "0.3"]  # 0.3 fails on purpose (test_review_helpers.LrBoom)


def env() -> dict:
    tests = ROOT / "tests"
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tests), str(HELPERS), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("tab")
    sweep_dir = work / "sweep"
    proc = run_hpctrain(["-m", f"lr={','.join(LRS)}", "max_steps=20", "model._target_=test_review_helpers.LrBoom",
                         "+model.boom_lr=0.3", "hydra/launcher=local", "hydra.launcher.max_parallel=2",
                         f"hydra.sweep.dir={sweep_dir}"], cwd=work, env=env(), check=False)
    assert proc.returncode != 0, "one run fails on purpose: the local launcher exits non-zero"
    return sweep_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Board:
    """``hpctrain tensorboard`` as a user starts it; its printed lines, its URL (with the token)."""

    def __init__(self, sweep_dir: Path, *flags: str) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "tensorboard", str(sweep_dir), "--port",
                                      str(self.port), *flags], cwd=sweep_dir.parent, env=hpctrain_env(env()),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.printed = []
        while not any("Ctrl-C to stop" in line for line in self.printed):  # printed once TensorBoard answers
            line = self.proc.stdout.readline()
            assert line, self.stop()
            self.printed.append(line)
        self.url = next(line.split()[1] for line in self.printed if line.strip().startswith("URL:"))
        self.base = self.url.split("?")[0].rstrip("/")  # the session's own path (token_gate.py)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        return "".join(self.printed) + out + err


@pytest.fixture(scope="module")
def board(sweep):
    b = Board(sweep)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]'")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y --no-install-recommends chromium")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, board):
    """One page that has opened the printed URL (the token), on the hpctrain tab."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.goto(board.url + "#hpctrain")
    yield pg
    context.close()


def tab(page):
    """The hpctrain tab's iframe, once it has drawn the runs."""
    deadline = time.time() + 60
    while time.time() < deadline:
        frame = next((f for f in page.frames if "plugin_entry.html?name=hpctrain" in f.url), None)
        if frame is not None and frame.query_selector("#runs"):
            return frame
        page.wait_for_timeout(200)
    raise AssertionError(f"the hpctrain tab did not draw its runs: frames {[f.url for f in page.frames]}")


def _status(url: str, opener=None) -> int:
    try:
        with (opener or urllib.request.build_opener()).open(url, timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_without_the_token_every_request_is_refused_and_the_cookie_lets_in(board, sweep):
    token = re.search(r"[?&]token=([^&#\s]+)", board.url).group(1)
    for path in ("/", "/data/runs", "/data/plugin/hpctrain/data", "/data/plugin/hpctrain/index.js",
                 "/experiment/defaultExperimentId/data/plugin/hparams/experiment", f"/?token={token}x"):
        assert _status(board.base + path) == 403, path  # plain urllib: no token, no cookie
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(board.url, timeout=30) as r:
        assert r.status == 200
        set_cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and token not in set_cookie
    assert _status(board.base + "/data/plugin/hpctrain/data", opener) == 200  # the cookie alone
    assert _status(board.base + "/data/runs", opener) == 200
    # the token is in no process's command line and in no file of the sweep
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        except OSError:
            pass
    for path in sweep.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert token.encode() not in path.read_bytes(), path
    assert re.search(rf"ssh -N -L {board.port}:127\.0\.0\.1:{board.port} \S+@\S+", "".join(board.printed))


def test_the_tab_shows_every_run_with_its_state_and_the_failed_runs_error(page, tmp_path):
    frame = tab(page)
    page.screenshot(path=str(tmp_path / "tab_runs.png"))
    states = {int(tr.get_attribute("data-idx")): tr.get_attribute("data-state")
              for tr in frame.query_selector_all("#runs tr[data-idx]")}
    assert states == {0: "completed", 1: "completed", 2: "failed"}
    rows = {int(tr.get_attribute("data-idx")): tr.inner_text() for tr in frame.query_selector_all("#runs tr[data-idx]")}
    assert "lr=0.01" in rows[0] and "20/20" in rows[0] and "lr=0.3" in rows[2]
    assert "3 runs: 2 completed, 1 failed" in frame.inner_text("#counts")
    failed = frame.inner_text("#failed")
    assert "#2 lr=0.3" in failed and "RuntimeError: LrBoom: this run fails on purpose" in failed
    assert frame.query_selector("#failed .failed[data-idx='2'] .tail") is not None  # its log tail
    assert "nothing waiting" in frame.inner_text("#queue")
    # TensorBoard's own tabs are there as before
    names = page.inner_text("body").lower()
    assert "scalars" in names and "hparams" in names and "hpctrain" in names


def test_the_tab_shows_a_straggler_with_its_node_in_the_run_s_note_and_its_own_section(page, sweep, tmp_path):
    """What rank 0's trainer writes when it flags a straggler (hpctrain.job.straggler) drawn by the page: the
    run's note cell and the Stragglers section name the rank, its node and the factor (the detection itself:
    tests/test_stragglers.py)."""
    from hpctrain.core import summary
    from hpctrain.job.straggler import Straggler

    manifest = json.loads((sweep / "sweep.json").read_text())
    run0 = sweep / manifest["runs"]["0"]["run_dir"]
    summary.write(run0, stragglers=[Straggler(1, "n2", 1.83, 60, 20, 0.0183, 0.01).to_dict()])
    frame = tab(page)
    frame.wait_for_selector("#stragglers .straggler[data-idx='0']", timeout=10_000)
    assert "straggler: rank 1 on n2, 1.8x" in frame.inner_text("#stragglers")
    assert "straggler: rank 1 on n2, 1.8x" in frame.inner_text("#runs tr[data-idx='0']")
    page.screenshot(path=str(tmp_path / "tab_straggler.png"))


def test_hparams_still_lists_the_swept_keys_first(browser, board, tmp_path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    try:
        pg.goto(board.url + "#hparams")
        pg.wait_for_selector("text=Hyperparameters", timeout=60_000)
        pg.wait_for_selector("text=Trial ID", timeout=60_000)
        pg.screenshot(path=str(tmp_path / "hparams.png"))
        names = pg.locator("paper-checkbox").all_inner_texts()  # the query pane's hparams, in order
        assert names[0] == "lr", names[:8]  # the swept key, alone: the constants are in each run's config text
        assert not {"max_steps", "model._target_", "model.boom_lr"} & set(names), names[:8]
        header = pg.locator("vaadin-grid-cell-content").all_inner_texts()
        assert header[:3] == ["Trial ID", "Show Metrics", "lr"], header[:8]  # the table's first hparam column
    finally:
        context.close()


def test_the_time_series_tab_shows_the_objective_and_the_losses_first(browser, board, tmp_path):
    from urllib.parse import parse_qs, urlparse

    pinned = json.loads(parse_qs(urlparse(board.url).query)["pinnedCards"][0])
    assert [c["tag"] for c in pinned] == ["val/loss", "train/loss"]  # the objective (val/loss here), the losses
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    try:
        pg.goto(board.url + "#timeseries")
        pg.wait_for_selector("text=Pinned", timeout=60_000)
        # a card's title is drawn as "val" and "/loss" on two lines
        pg.wait_for_function("() => document.body.innerText.replace(/\\n/g, '').includes('train/loss')",
                             timeout=60_000)
        text = pg.inner_text("body").replace("\n", "")
        first = {tag: text.find(tag) for tag in ("val/loss", "train/loss", "perf/", "sys/")}
        assert -1 < first["val/loss"] < first["train/loss"], first
        assert all(first["train/loss"] < at for tag, at in first.items() if tag in ("perf/", "sys/") and at >= 0), first
    finally:
        pg.screenshot(path=str(tmp_path / "timeseries.png"))
        (tmp_path / "timeseries.txt").write_text(pg.inner_text("body"))
        context.close()


def test_opening_the_root_without_the_pinned_cards_still_shows_the_losses_first(browser, board, tmp_path):
    from urllib.parse import parse_qs, urlparse

    token = parse_qs(urlparse(board.url).query)["token"][0]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    try:
        # the cookie from a request that is not TensorBoard's page: no pinned cards reach the browser's settings
        assert pg.goto(f"{board.base}/data/environment?token={token}").status == 200
        pg.goto(board.base + "/#timeseries")  # `/`, as a bookmark or a link without the printed query opens it
        pg.wait_for_function("() => document.body.innerText.replace(/\\n/g, '').includes('train/loss')",
                             timeout=60_000)
        pg.wait_for_function("() => document.body.innerText.includes('perf') || document.body.innerText.includes('sys')",
                             timeout=60_000)
        text = pg.inner_text("body").replace("\n", "")
        first = {tag: text.find(tag) for tag in ("val/loss", "train/loss", "perf/", "sys/")}
        assert -1 < first["val/loss"] < first["train/loss"], first
        assert all(first["train/loss"] < at for tag, at in first.items() if tag in ("perf/", "sys/") and at >= 0), first
        assert "#timeseries" in pg.url and "pinnedCards" in pg.url  # the fragment kept across the redirect
    finally:
        pg.screenshot(path=str(tmp_path / "root.png"))
        (tmp_path / "root.txt").write_text(pg.inner_text("body"))
        context.close()


def test_no_token_keeps_the_old_behaviour_with_a_warning(sweep):
    b = Board(sweep, "--no-token")
    try:
        assert b.url.startswith(f"http://127.0.0.1:{b.port}/?pinnedCards=") and "token" not in b.url
        assert _status(b.base + "/data/plugin/hpctrain/data") == 200
    finally:
        out = b.stop()
    assert "warning: --no-token" in out and "every user" in out


def test_an_unknown_or_unreadable_sweep_dir_is_one_line_and_the_backend_says_what_it_could_not_read(sweep, tmp_path):
    from hpctrain.review.tensorboard_plugin.data import TailCache, payload

    proc = subprocess.run([sys.executable, "-m", "hpctrain", "tensorboard", str(tmp_path / "nope")],
                          env=hpctrain_env(env()), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no such directory" in proc.stderr and "Traceback" not in proc.stderr

    gone = payload(tmp_path / "nope", TailCache())
    assert gone["runs"] == [] and "no such directory" in gone["problems"][0]
    unreadable = tmp_path / "unreadable"
    (unreadable / "sweep.json").mkdir(parents=True)  # neither file can be opened as a file
    (unreadable / "multirun.yaml").mkdir()
    got = payload(unreadable, TailCache())
    assert got["runs"] == [] and str(unreadable) in got["problems"][0]

    torn = tmp_path / "torn"
    shutil.copytree(sweep, torn, symlinks=True)
    manifest = json.loads((torn / "sweep.json").read_text())
    run0 = torn / manifest["runs"]["0"]["run_dir"]
    text = (run0 / "metrics.json").read_text()
    (run0 / "metrics.json").write_text(text[: len(text) // 2])
    got = payload(torn, TailCache())
    assert [r["state"] for r in got["runs"]] == ["completed", "completed", "failed"]  # from the run record
    assert any("metrics.json could not be read" in p and "#0" in p for p in got["problems"]), got["problems"]
    json.dumps(got, allow_nan=False)  # what the page parses: no NaN, no Infinity


def test_a_search_sweep_gives_its_trials_and_their_history(sweep, tmp_path):
    from hpctrain.review.tensorboard_plugin.data import TailCache, payload

    search = tmp_path / "search"
    shutil.copytree(sweep, search, symlinks=True)
    manifest = json.loads((search / "sweep.json").read_text())
    manifest["search"] = {"metric": "val/loss", "direction": "minimize"}
    (search / "sweep.json").write_text(json.dumps(manifest))
    got = payload(search, TailCache())
    assert got["search"]["metric"] == "val/loss" and got["search"]["mode"] == "min"
    truth = {int(i): json.loads((search / r["run_dir"] / "metrics.json").read_text()) for i, r in manifest["runs"].items()}
    history = {n: v for n, v, _ in got["search"]["history"]}
    assert set(history) <= {0, 1} and history  # trials with an objective (the failed one has none)
    for n, v in history.items():
        assert v == pytest.approx(truth[n]["metrics"]["val/loss"])


def test_the_tab_is_registered_by_entry_point_and_served_once():
    from tensorboard import default

    from hpctrain.review import tensorboard_server
    from hpctrain.review.tensorboard_plugin import HpctrainLoader

    assert HpctrainLoader in default.get_dynamic_plugins()  # [project.entry-points.tensorboard_plugins]
    ours = [p for p in tensorboard_server.plugins() if p is HpctrainLoader or isinstance(p, HpctrainLoader)]
    assert len(ours) == 1


def test_the_history_is_robust_to_an_outlier_and_draws_the_best_so_far_and_the_log_link(browser, sweep, tmp_path):
    search = tmp_path / "search"
    shutil.copytree(sweep, search, symlinks=True)
    manifest = json.loads((search / "sweep.json").read_text())
    manifest["search"] = {"metric": "val/loss", "direction": "minimize"}
    (search / "sweep.json").write_text(json.dumps(manifest))
    values = {"0": 0.9, "1": 13.1, "2": 0.85}  # one outlier beside the rest
    for i, value in values.items():
        run_dir = search / manifest["runs"][i]["run_dir"]
        record = json.loads((run_dir / "metrics.json").read_text())
        record.setdefault("metrics", {})["val/loss"] = value
        record["status"] = "completed"
        (run_dir / "metrics.json").write_text(json.dumps(record))
    from hpctrain.core import events

    events.submitted(search / manifest["runs"]["2"]["run_dir"])
    events.completed(search / manifest["runs"]["2"]["run_dir"])
    b = Board(search)
    try:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        pg = context.new_page()
        pg.goto(b.url + "#hpctrain")
        frame = tab(pg)
        frame.wait_for_selector("#history", timeout=10_000)
        points = frame.get_attribute("#best-so-far", "points").split()
        assert len(points) >= 3, points  # a staircase over the trials, on to the last one
        ys = [float(p.split(",")[1]) for p in points]
        assert ys == sorted(ys) and ys[-1] > ys[0], points  # it only improves (down is a lower loss: larger y)
        assert frame.get_attribute("#history-scale", "data-scale") == "clipped"
        dots = [float(c.get_attribute("cy")) for c in frame.query_selector_all("#history circle")]
        assert dots[2] - dots[0] > 100, dots  # 0.9 (trial 0) and 0.85 (trial 2) far apart, not flattened by 13.1
        link = frame.query_selector("#runs tr[data-idx='0'] a.log")
        assert link is not None
        text = frame.evaluate("async () => (await fetch('./log?idx=0', {credentials: 'same-origin'})).text()")
        assert text.strip() and "no log yet" not in text, text
        context.close()
    finally:
        b.stop()


# last: it changes the sweep's files
def test_the_tab_follows_state_changes_on_disk_within_5_s(page, sweep, tmp_path):
    from hpctrain.core import events

    frame = tab(page)
    manifest = json.loads((sweep / "sweep.json").read_text())
    run0, run1 = (sweep / manifest["runs"][i]["run_dir"] for i in ("0", "1"))
    changed = time.time()
    events.submitted(run0)  # run 0 submitted again, then cancelled
    events.cancelled(run0)
    frame.wait_for_selector("#runs tr[data-idx='0'][data-state='cancelled']", timeout=5_000)
    assert time.time() - changed < 5.0
    page.screenshot(path=str(tmp_path / "tab_cancelled.png"))

    changed = time.time()
    events.submitted(run1)  # run 1 again, failing this time
    events.started(run1, job_id=str(os.getpid()))
    events.failed(run1, "Traceback (most recent call last):\nRuntimeError: written to disk by the test", rank=0)
    frame.wait_for_selector("#runs tr[data-idx='1'][data-state='failed']", timeout=5_000)
    assert time.time() - changed < 5.0
    frame.wait_for_selector("#failed .failed[data-idx='1']", timeout=5_000)
    assert "RuntimeError: written to disk by the test" in frame.inner_text("#failed .failed[data-idx='1']")

    text = (run0 / "metrics.json").read_text()  # a torn metrics.json: the row stays, the page says so
    (run0 / "metrics.json").write_text(text[: len(text) // 2])
    frame.wait_for_selector("#problems", timeout=5_000)
    assert "metrics.json could not be read" in frame.inner_text("#problems")
    assert frame.query_selector("#runs tr[data-idx='0'][data-state='cancelled']") is not None
    page.screenshot(path=str(tmp_path / "tab_failed_and_torn.png"))


# ---------------------------------------------------------------- the session cannot be taken by a neighbour
class _Recorder:
    """A colleague's server on another port of this host: records the Cookie header of every request."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.cookies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                seen.append(self.headers.get("Cookie") or "")
                body = b"<html><body>a colleague's board</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_another_ports_server_never_receives_the_session_cookie(browser, board):
    other = _Recorder()
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(board.url + "#hpctrain")
        ours = [c for c in context.cookies() if c["name"] == f"hpctrain-tb-{board.port}"]
        for path in ("/", "/data/runs", "/data/plugin/hpctrain/data", "/s/"):
            pg.goto(f"http://127.0.0.1:{other.port}{path}")  # a colleague's board on the next port, its pages
    finally:
        context.close()
        other.server.shutdown()
    assert ours and ours[0]["path"] == board.base.split(str(board.port), 1)[1], ours  # the session's own path
    assert len(other.cookies) >= 4 and not any(f"hpctrain-tb-{board.port}" in c for c in other.cookies), other.cookies
    # our cookie's name with the value another session would derive (another token, port or path): refused
    forged = f"hpctrain-tb-{board.port}={ours[0]['value'][:-4]}0000"
    request = urllib.request.Request(board.base + "/data/runs", headers={"Cookie": forged})
    assert _status(request) == 403


def test_a_request_naming_another_host_is_refused(board):
    import http.client

    token = re.search(r"[?&]token=([^&#\s]+)", board.url).group(1)
    path = board.base.split(str(board.port), 1)[1] + f"/?token={token}"
    # let in: TensorBoard's page, which redirects to itself with the pinned loss cards (302)
    for host, expected in ((f"evil.example:{board.port}", 403), (f"127.0.0.1:{board.port + 1}", 403),
                           (f"localhost:{board.port}", 302), (f"127.0.0.1:{board.port}", 302)):
        conn = http.client.HTTPConnection("127.0.0.1", board.port, timeout=30)
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        body = response.read()
        conn.close()
        assert response.status == expected, (host, body[:200])
        if expected == 302:
            assert "pinnedCards=" in response.getheader("Location", "") and token not in response.getheader("Location")
        if expected == 403:
            assert b"Host" in body and token.encode() not in body


def test_the_url_is_printed_only_once_our_server_has_bound_the_port(sweep):
    import psutil

    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", 0))  # bound, not listening yet: the parent's port check passes
    port = squatter.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "tensorboard", str(sweep), "--port", str(port)],
                            cwd=sweep.parent, env=hpctrain_env(env()), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not psutil.Process(proc.pid).children() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)  # the TensorBoard child started: the parent has checked the port
        squatter.listen(8)  # another user takes the port before TensorBoard binds it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        squatter.close()
    assert "URL:" not in out and "token=" not in out + err, out
    assert proc.returncode != 0 and "hpctrain tensorboard: error:" in err, err
