"""``python -m hpctrain``: a review subcommand (status, report, cancel, tensorboard) or the Hydra app.

Login-node path: nothing here imports torch.
"""

import shutil
import sys
from typing import List, Optional

SUBCOMMANDS = ("status", "report", "cancel", "tensorboard")


def pick_launcher(argv: List[str]) -> List[str]:
    """In multirun mode without an explicit launcher: Slurm when sbatch is on PATH, else local."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    explicit = any(a.startswith(("hydra/launcher=", "override hydra/launcher")) for a in argv)
    if not multirun or explicit:
        return argv
    choice = "slurm" if shutil.which("sbatch") else "local"
    why = "sbatch found on PATH" if choice == "slurm" else "no sbatch on PATH"
    print(f"hpctrain: launcher {choice} ({why}; choose with hydra/launcher=local|slurm)", file=sys.stderr)
    return argv + [f"hydra/launcher={choice}"]


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from hpctrain.review.cli import run_subcommand

        sys.exit(run_subcommand(argv))
    sys.argv = [sys.argv[0]] + pick_launcher(argv)
    from hpctrain.app import main as hydra_main

    hydra_main()


if __name__ == "__main__":
    main()
