"""A Slurm submission's sending, counted (the same on a loaded machine): submitit's pickles, one a task, get
their mode from the umask worked out once a submission, not read from ``/proc/self/status`` once a pickle
(issue 31 item 3: 10,000 reads for 10,000 tasks). An ``sbatch`` earlier on PATH answers as sbatch does."""

import os
import subprocess
import sys

FAKE_SBATCH = """#!/bin/sh
n=$(cat "$FAKE_SBATCH_COUNTER" 2>/dev/null || echo 7000000); n=$((n + 1)); echo "$n" > "$FAKE_SBATCH_COUNTER"
echo "Submitted batch job $n"
"""

# python -m hpctrain, its reads of /proc/self/status counted
DRIVER = """
import builtins, sys
reads = [0]
real_open = builtins.open
def counted(file, *a, **k):
    reads[0] += file == "/proc/self/status"
    return real_open(file, *a, **k)
builtins.open = counted
from hpctrain.__main__ import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("READS", reads[0])
"""


def test_a_submission_reads_the_umask_a_few_times_not_once_a_task(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_SBATCH_COUNTER=str(tmp_path / "counter"))
    argv = ["-m", "seed=range(60)", "max_steps=10", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "+hydra.launcher.additional_parameters.hold=true"]
    out = subprocess.run([sys.executable, "-c", DRIVER, *argv], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert "submitted 60 run(s) as Slurm job 7000001" in out.stdout, out.stdout + out.stderr
    reads = int(next(ln for ln in out.stdout.splitlines() if ln.startswith("READS ")).split()[1])
    assert reads < 10, out.stdout  # 60 and more before: one a pickle
