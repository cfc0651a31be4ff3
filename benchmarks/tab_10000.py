"""How long the hpctrain tab takes to show a 10,000-run sweep in a real browser (the budget is 2 s).

The sweep is made as ``status_1000.py`` makes its own (a small real local sweep's run files copied into a
Slurm-style sweep dir: 75 % completed, 10 % failed, 10 % whose job left the queue while running, 5 %
never started). ``hpctrain tensorboard`` serves it; Chromium (Playwright, /usr/bin/chromium) opens the
printed URL on the hpctrain tab. Timed: a render as the page measures it (its JSON fetched and parsed, then
drawn; the median of the refreshes after the first), the first render (while TensorBoard itself still
reads the 10,000 runs' event files in the same process), the time from navigation until the first page
of rows is drawn (TensorBoard's own page load included), and the JSON route alone (urllib, best of 3).
The route serves the newest read of the sweep and starts the next in a thread (plugin.LatestRead), so
one read of the sweep (``data.payload``, timed here in-process before the server starts, best of 3) is
printed too: a change on disk reaches the page within one poll (2 s) plus one read.

    python benchmarks/tab_10000.py                      # makes a small real local sweep first (~20 s)
    python benchmarks/tab_10000.py --source SWEEP_DIR   # or copies the runs of an existing sweep

The last line printed is the figure.
"""

import argparse
import http.cookiejar
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_1000 import build_sweep, make_source  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
REFRESHES = 9
PAGE_ROWS = 500  # the tab draws the runs a page at a time (static/index.js PAGE_ROWS)


def serve(sweep: Path) -> "tuple[subprocess.Popen, str]":
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "tensorboard", str(sweep)], stdout=subprocess.PIPE,
                            text=True)
    url = None
    for line in proc.stdout:
        url = url or (line.split()[1] if line.strip().startswith("URL:") else None)
        if "Ctrl-C to stop" in line:
            break
    if url is None:
        raise SystemExit(f"hpctrain tensorboard did not start (exit {proc.poll()})")
    return proc, url


def time_json(url: str, repeats: int = 3) -> "tuple[float, int]":
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    opener.open(url, timeout=60).read()
    data_url = re.sub(r"/\?token=.*", "/data/plugin/hpctrain/data", url)
    times, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        size = len(opener.open(data_url, timeout=60).read())
        times.append(time.perf_counter() - t0)
    return min(times), size


def time_read(sweep: Path, repeats: int = 3) -> float:
    from hpctrain.review.tensorboard_plugin.data import TailCache, payload

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        payload(sweep, TailCache())
        times.append(time.perf_counter() - t0)
    return min(times)


def time_browser(url: str, n: int) -> "tuple[float, float, float]":
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        t0 = time.perf_counter()
        page.goto(url + "#hpctrain")
        frame = None
        last_row = f"#runs[data-total='{n}'] tr[data-idx='{min(n, PAGE_ROWS) - 1}']"  # the first page, all drawn
        while frame is None or frame.query_selector(last_row) is None:
            page.wait_for_timeout(20)
            frame = next((f for f in page.frames if "plugin_entry.html?name=hpctrain" in f.url), None)
            if time.perf_counter() - t0 > 120:
                raise SystemExit("the tab did not draw its rows within 120 s")
        shown = time.perf_counter() - t0
        first = _render_s(frame)
        later = []
        for _ in range(REFRESHES):  # the page polls every 2 s: each refresh is a full re-read and redraw
            seen = frame.get_attribute("#hpctrain", "data-updated")
            while frame.get_attribute("#hpctrain", "data-updated") == seen:
                page.wait_for_timeout(50)
            later.append(_render_s(frame))
        browser.close()
    return shown, first, statistics.median(later)


def _render_s(frame) -> float:
    """The page's own figure for its last refresh: the JSON fetched and parsed, then drawn."""
    return (float(frame.get_attribute("#hpctrain", "data-fetch-ms"))
            + float(frame.get_attribute("#hpctrain", "data-draw-ms"))) / 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, help="a finished sweep whose runs are copied (default: make one)")
    p.add_argument("--runs", type=int, default=10000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-tab-bench-") as tmp:
        work = Path(tmp)
        source = args.source or make_source(work)
        sweep = build_sweep(source.absolute(), work / "sweep", args.runs)
        read_s = time_read(sweep)
        proc, url = serve(sweep)
        try:
            json_s, size = time_json(url)
            shown, first, refresh = time_browser(url, args.runs)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"one read of the sweep (data.payload, in-process, best of 3): {read_s:.2f} s")
    print(f"JSON route alone: {json_s:.2f} s ({size / 1e6:.1f} MB, best of 3); navigation to the first page of rows drawn "
          f"(TensorBoard's own page load included): {shown:.2f} s; the tab's first render: {first:.2f} s")
    print(f"hpctrain tab on {args.runs} runs: {refresh:.2f} s to render (fetch, parse and draw; median of "
          f"{REFRESHES} refreshes)")


if __name__ == "__main__":
    main()
