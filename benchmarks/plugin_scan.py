"""What installing hpctrain costs an unrelated Hydra app at start-up (Hydra's plugin scan).

The same trivial ``@hydra.main`` app starts in fresh interpreters, interleaved: once with hpctrain's
checkout on ``sys.path`` (as ``pip install -e .`` puts it there) and once with it taken off before Hydra
is imported. Both go through the same small runner, so only the plugin scan differs. Prints each
pair, the modules the "with" run imported of hpctrain and submitit, and the median ratio last.

    .venv/bin/python benchmarks/plugin_scan.py --repeats 15
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])

APP = textwrap.dedent('''
    import hydra

    @hydra.main(version_base="1.3", config_path=None)
    def main(cfg):
        return 0

    if __name__ == "__main__":
        main()
''')

RUNNER = textwrap.dedent('''
    import os, runpy, sys
    root = os.path.realpath(sys.argv[1])
    if sys.argv[2] == "without":
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != root]
    app, report = sys.argv[3], sys.argv[4]
    sys.argv = [app, "hydra.run.dir=" + os.path.dirname(app) + "/out", "hydra/hydra_logging=none",
                "hydra/job_logging=none"]
    try:
        runpy.run_path(app, run_name="__main__")
    except SystemExit:
        pass
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("hpctrain", "submitit", "torch")
                    or m.startswith("hydra_plugins.hpctrain_launcher"))
    open(report, "w").write("\\n".join(loaded))
''')


def one(where: str, tmp: Path) -> "tuple[float, list[str]]":
    report = tmp / f"{where}.txt"
    start = time.perf_counter()
    subprocess.run([sys.executable, str(tmp / "runner.py"), ROOT, where, str(tmp / "app.py"), str(report)],
                   check=True, cwd=tmp)
    return time.perf_counter() - start, report.read_text().split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "app.py").write_text(APP)
        (tmp / "runner.py").write_text(RUNNER)
        one("with", tmp), one("without", tmp)  # warm the file cache
        with_s, without_s, ratios = [], [], []
        loaded_with: list = []
        for i in range(args.repeats):
            order = ("with", "without") if i % 2 == 0 else ("without", "with")
            t = {}
            for where in order:
                t[where], loaded = one(where, tmp)
                if where == "with":
                    loaded_with = loaded
                elif loaded:
                    sys.exit(f"the 'without' run still imported {loaded}: hpctrain was not taken off sys.path")
            with_s.append(t["with"]), without_s.append(t["without"]), ratios.append(t["with"] / t["without"])
            print(f"repeat {i:2d}: with {t['with']:.3f} s, without {t['without']:.3f} s, ratio {ratios[-1]:.3f}")
    print(f"modules of hpctrain/submitit/torch a trivial app imported with hpctrain installed: {loaded_with or 'none'}")
    print(f"median start: with {statistics.median(with_s):.3f} s, without {statistics.median(without_s):.3f} s")
    print(f"median ratio with/without hpctrain installed: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
