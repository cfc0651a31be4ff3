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

The wall time mixes the estimate of the work with the estimate of the pace (the machine's speed, which on a
shared machine moves several-fold within a run). So for each ETA line the script also says, from the trials'
records (each start, pause, prune and completion with its step; a running unit's step taken as growing evenly
between its start and end records), the steps still to train as :func:`hpctrain.search.eta.steps_left`
estimates them from the trials as they were then, against the steps really trained after; and the pace's part
of the error: the line's ETA / time left divided by that. Run it at high priority to approximate a quiet
machine (``nice -n -15``, as root) and note the load average (benchmarks/README.md).
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

from hpctrain.core import events
from hpctrain.core.atomic import read_json
from hpctrain.core.state import EventKind
from hpctrain.search.eta import Trial, steps_left

ETA = re.compile(r"ETA (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\]")


def seconds(m: "re.Match[str]") -> float:
    h, mnt, s = (int(g) if g else 0 for g in m.groups())
    return 3600 * h + 60 * mnt + s


Record = Tuple[float, EventKind, Optional[int]]


def records(sweep: Path, max_steps: int) -> List[List[Record]]:
    """Each trial's records (epoch seconds, kind, the step it ended a unit at) in time order."""
    out = []
    for run_dir in sorted(sweep.glob("trial-*")):
        found = []
        for e in events.events(run_dir):
            step = (read_json(e.path) or {}).get("step") if e.kind in (EventKind.PAUSED, EventKind.PRUNED) else None
            found.append((e.time_ns / 1e9, e.kind, max_steps if e.kind is EventKind.COMPLETED else step))
        out.append(sorted(found, key=lambda r: r[0]))
    return out


def trials_at(history: List[List[Record]], at: float) -> Tuple[List[Trial], float]:
    """The trials as the records say they were at ``at`` (a running unit's step taken as growing evenly from
    its start record to its end record), and the steps trained by then."""
    trials, trained = [], 0.0
    for recs in history:
        step, state, unit = 0, None, None  # unit: (start time, its end time, its end step) while running
        for k, (t, kind, end) in enumerate(recs):
            if t > at:
                break
            if kind is EventKind.STARTED:
                after = next(((t2, s2) for t2, k2, s2 in recs[k + 1:] if k2 in ENDS and s2 is not None), None)
                state, unit = "running", (t, after[0], after[1]) if after else None
            elif kind in ENDS:
                step, state, unit = int(end if end is not None else step), \
                    ("paused" if kind is EventKind.PAUSED else "final"), None
            elif kind in (EventKind.FAILED, EventKind.CANCELLED):
                state, unit = "final", None
        if state is None:
            continue
        now = float(step)
        if state == "running" and unit is not None and unit[1] > unit[0]:
            now = step + (unit[2] - step) * min(1.0, (at - unit[0]) / (unit[1] - unit[0]))
        trained += now
        trials.append(Trial(int(now), state == "final", state == "paused"))
    return trials, trained


ENDS = (EventKind.PAUSED, EventKind.COMPLETED, EventKind.PRUNED)


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
    search = {"scheduler": "asha", "min_steps": 20, "eta": 3, "max_steps": args.max_steps, "n_trials": args.trials,
              "workers": args.workers or 1}  # the local launcher on a machine without GPUs: one at a time
    history = records(where / "sweep", args.max_steps)
    times = [r[0] for recs in history for r in recs]
    total = trials_at(history, float("inf"))[1]
    print(f"first record {min(times) - wall0:.1f} s after the start; command ended {wall0 + end - max(times):.1f} s "
          f"after the last record; {total:.0f} steps trained")
    rows = []
    for at, text in lines:
        m = ETA.search(text)
        if m:
            predicted, actual = seconds(m), end - at
            trials, trained = trials_at(history, wall0 + at)
            guess, really = steps_left(trials, search["n_trials"], search), total - trained
            rows.append((at, predicted, actual, predicted / actual if actual > 0 else float("nan"), guess, really))
    # the ETA's error, split: (steps left estimated / really trained after) x (the pace's: seconds a step
    # estimated, ETA / steps estimated, over the time really left / the steps really trained in it)
    print(f"{'at s':>7} {'ETA s':>7} {'left s':>7} {'ETA/left':>8} {'steps est':>9} {'steps real':>10} "
          f"{'steps':>6} {'pace':>6}")
    for at, predicted, actual, ratio, guess, really in rows:
        work = guess / really if really > 0 else float("nan")
        print(f"{at:7.1f} {predicted:7.0f} {actual:7.1f} {ratio:8.2f} {guess:9.0f} {really:10.0f} {work:6.2f} "
              f"{ratio / work if work > 0 else float('nan'):6.2f}")
    later = [r for r in rows if r[0] >= 0.1 * end and r[2] >= 5]  # the last seconds' ETA rounds to whole seconds
    if not later:
        print("no ETA after the first 10 % of the search")
        return 1
    worst = max(later, key=lambda r: max(r[3], 1 / r[3]) if r[3] > 0 else float("inf"))
    within = sum(0.5 <= r[3] <= 1.5 for r in later)
    print(f"ETA/actual time left over {len(later)} line(s) after 10 % of {end:.0f} s: {within} within [0.5, 1.5] "
          f"({'met' if within == len(later) else 'NOT met'}); worst {worst[3]:.2f} (at {worst[0]:.0f} s), "
          f"median {statistics.median(r[3] for r in later):.2f}")
    work = [r[4] / r[5] for r in later if r[5] > 0]
    print(f"of those lines, steps left estimated / really trained after: {stats(work)}; the pace's part "
          f"(ETA/left over that): {stats([r[3] / (r[4] / r[5]) for r in later if r[5] > 0 and r[4] > 0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
