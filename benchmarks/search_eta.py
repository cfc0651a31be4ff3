"""A search's ETA against the real time left (issue 29 item 6): the README's ASHA example on the local launcher.

    python benchmarks/search_eta.py            # the README's command: 27 trials, rungs 20, 60, 180, 540
    options: --trials N (27) --max-steps N (540) --workers N (the launcher's default) --keep DIR

Runs ``python -m hpctrain -m hydra/sweeper=search 'lr=tag(log,interval(1e-4,1))' hydra.sweeper.scheduler=asha
hydra.sweeper.min_steps=20 hydra.sweeper.eta=3 max_steps=540 eval_every=10 hydra.sweeper.n_trials=27
hydra/launcher=local`` with its output piped (one line per event, each ending ``[... ETA X]``), stamps each
line as it arrives, and once the command has ended prints, for every line with an ETA, the ETA against the
time the search really still took from then (the command's end), and their ratio. The last line is the
headline, the criterion of issue 29 item 6 ("within 50 %"): of the ETAs printed after the first 10 % of the
search's wall time (before that no trial has a measured speed worth the name) and more than 5 s before its
end (the ETA is printed in whole seconds), how many lie within [0.5, 1.5] x the real time left; their worst
and median ratio. "met" when all of them do.

The wall time mixes the estimate of the work with the machine's speed, which on a shared machine moves
several-fold within a run. So the script also replays the trials' records (each start, pause, prune and
completion with its step): at each, the steps still to train as :func:`hpctrain.search.eta.steps_left`
estimates them, against the steps the search really trained after it; and the same for the previous estimate
(a share of each rung as measured going on: the scheduler named ``hyperband`` takes that path), over the same
window.
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpctrain.core import events
from hpctrain.core.atomic import read_json
from hpctrain.core.state import EventKind
from hpctrain.search.eta import Trial, steps_left

ETA = re.compile(r"ETA (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\]")


def seconds(m: "re.Match[str]") -> float:
    h, mnt, s = (int(g) if g else 0 for g in m.groups())
    return 3600 * h + 60 * mnt + s


def replay(sweep: Path, t0: float, search: Dict[str, Any]) -> List[Tuple[float, float, float, int]]:
    """(seconds since ``t0``, steps left as estimated, as the rung shares estimate, steps really trained after)
    at each record of the search's trials."""
    found: List[Tuple[int, int, EventKind, Optional[int]]] = []
    for n, run_dir in enumerate(sorted(sweep.glob("trial-*"))):
        for e in events.events(run_dir):
            step = (read_json(e.path) or {}).get("step") if e.kind in (EventKind.PAUSED, EventKind.PRUNED) else None
            found.append((e.time_ns, n, e.kind, step))
    found.sort()
    state: Dict[int, Trial] = {}
    points = []
    for ns, n, kind, step in found:
        old = state.get(n, Trial(0, False))
        if kind is EventKind.STARTED:
            state[n] = Trial(old.step, False)
        elif kind is EventKind.PAUSED:
            state[n] = Trial(int(step or old.step), False, True)
        elif kind is EventKind.COMPLETED:
            state[n] = Trial(int(search["max_steps"]), True)
        elif kind in (EventKind.PRUNED, EventKind.FAILED):
            state[n] = Trial(int(step or old.step), True)
        else:
            continue
        trials = list(state.values())
        points.append((ns / 1e9 - t0, steps_left(trials, search["n_trials"], search),
                       steps_left(trials, search["n_trials"], dict(search, scheduler="hyperband")),
                       sum(t.step for t in trials)))
    total = points[-1][3] if points else 0
    return [(at, new, shares, total - done) for at, new, shares, done in points]


def stats(ratios: List[float]) -> str:
    if not ratios:
        return "none"
    worst = max(ratios, key=lambda r: max(r, 1 / r) if r > 0 else float("inf"))
    return (f"{sum(0.5 <= r <= 1.5 for r in ratios)}/{len(ratios)} within [0.5, 1.5], worst {worst:.2f}, "
            f"median {statistics.median(ratios):.2f}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=27)
    p.add_argument("--max-steps", type=int, default=540)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--keep", type=Path, default=None)
    args = p.parse_args()
    where = args.keep or Path(tempfile.mkdtemp(prefix="search-eta-"))
    cmd = [sys.executable, "-m", "hpctrain", "-m", "hydra/sweeper=search", "lr=tag(log,interval(1e-4,1))",
           "hydra.sweeper.scheduler=asha", "hydra.sweeper.min_steps=20", "hydra.sweeper.eta=3",
           f"max_steps={args.max_steps}", "eval_every=10", f"hydra.sweeper.n_trials={args.trials}",
           "hydra/launcher=local", f"hydra.sweep.dir={where / 'sweep'}"]
    if args.workers:
        cmd.append(f"hydra.sweeper.n_workers={args.workers}")
    print("command:", " ".join(cmd), flush=True)
    start, wall0 = time.monotonic(), time.time()
    lines: List[Tuple[float, str]] = []
    proc = subprocess.Popen(cmd, cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
    code = proc.wait()
    end = time.monotonic() - start
    print(f"exit {code}; wall {end:.1f} s; sweep dir {where / 'sweep'}")
    if code != 0:
        print("\n".join(text for _, text in lines[-20:]))
        return 1
    rows = []
    for at, text in lines:
        m = ETA.search(text)
        if m:
            predicted, actual = seconds(m), end - at
            rows.append((at, predicted, actual, predicted / actual if actual > 0 else float("nan")))
    print(f"{'at s':>7} {'ETA s':>7} {'left s':>7} {'ETA/left':>8}")
    for at, predicted, actual, ratio in rows:
        print(f"{at:7.1f} {predicted:7.0f} {actual:7.1f} {ratio:8.2f}")
    later = [r for r in rows if r[0] >= 0.1 * end and r[2] >= 5]  # the last seconds' ETA rounds to whole seconds
    if not later:
        print("no ETA after the first 10 % of the search")
        return 1
    worst = max(later, key=lambda r: max(r[3], 1 / r[3]) if r[3] > 0 else float("inf"))
    within = sum(0.5 <= r[3] <= 1.5 for r in later)
    print(f"ETA/actual time left over {len(later)} line(s) after 10 % of {end:.0f} s: {within} within [0.5, 1.5] "
          f"({'met' if within == len(later) else 'NOT met'}); worst {worst[3]:.2f} (at {worst[0]:.0f} s), "
          f"median {statistics.median(r[3] for r in later):.2f}")
    search = {"scheduler": "asha", "min_steps": 20, "eta": 3, "max_steps": args.max_steps, "n_trials": args.trials,
              "workers": args.workers or 1}  # the local launcher on a machine without GPUs: one at a time
    work = [p for p in replay(where / "sweep", wall0, search) if p[0] >= 0.1 * end and end - p[0] >= 5]
    print(f"steps left estimated / really trained after, at {len(work)} trial record(s) in the same window: "
          f"rule played on: {stats([p[1] / p[3] for p in work if p[3] > 0])}; "
          f"rung shares (before): {stats([p[2] / p[3] for p in work if p[3] > 0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
