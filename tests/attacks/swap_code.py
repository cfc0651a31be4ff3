"""Run as ANOTHER user of the sweep dir's group: try to put our own code where the victim's jobs load it.

python3 swap_code.py SWEEP_DIR -> prints a JSON list of what worked (the victim's test expects none).
Attempts: rewrite a module of the code snapshot, the payload pickle and submitit's pickles, add a module,
rename .hpctrain / .submitit / code / the sweep dir itself away (to put a copy of our own in its place).
"""

import glob
import json
import os
import sys

sweep = sys.argv[1]
worked = []


def attempt(what, fn):
    try:
        fn()
        worked.append(what)
    except OSError:
        pass


def rewrite(path):
    with open(path, "r+b") as f:
        f.write(b"import os; os.system('touch /tmp/pwned')  # ")


for path in glob.glob(os.path.join(sweep, ".hpctrain", "submission-*", "code", "**", "*.py"), recursive=True)[:50]:
    attempt(f"rewrite {path}", lambda p=path: rewrite(p))
for path in glob.glob(os.path.join(sweep, ".hpctrain", "*.pkl")) + glob.glob(os.path.join(sweep, ".submitit", "*.pkl")):
    attempt(f"rewrite {path}", lambda p=path: rewrite(p))
for code in glob.glob(os.path.join(sweep, ".hpctrain", "submission-*", "code")):
    attempt(f"add a module to {code}", lambda c=code: open(os.path.join(c, "sitecustomize.py"), "x").close())
    attempt(f"rename {code}", lambda c=code: os.rename(c, c + ".old"))
for name in (".hpctrain", ".submitit"):
    attempt(f"rename {name}", lambda n=name: os.rename(os.path.join(sweep, n), os.path.join(sweep, n + ".old")))
attempt("rename the sweep dir", lambda: os.rename(sweep, sweep.rstrip("/") + ".old"))
print(json.dumps(worked))
