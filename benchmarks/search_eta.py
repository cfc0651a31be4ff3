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
"""

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

ETA = re.compile(r"ETA (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\]")


def seconds(m: "re.Match[str]") -> float:
    h, mnt, s = (int(g) if g else 0 for g in m.groups())
    return 3600 * h + 60 * mnt + s


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
    start = time.monotonic()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
