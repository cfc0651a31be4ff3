"""``python -m hpctrain``: a review subcommand (status, report, cancel, tensorboard) or the Hydra app.

Login-node path: nothing here imports torch.
"""

import shutil
import sys
from typing import Any, List, Optional

SUBCOMMANDS = ("status", "report", "cancel", "tensorboard")
HELP = """\
usage: python -m hpctrain [OVERRIDES]          one training run, in this process
       python -m hpctrain -m [OVERRIDES]       a sweep: one run per point (Hydra multirun)
       python -m hpctrain status [SWEEP_DIR]   state and progress of every run (--watch, --json)
       python -m hpctrain report [SWEEP_DIR]   results table, best config, plots (--metric, --mode)
       python -m hpctrain cancel [SWEEP_DIR]   cancel what is still queued or running (--run INDEX)
       python -m hpctrain tensorboard [SWEEP_DIR]   TensorBoard over the sweep, on 127.0.0.1
SWEEP_DIR defaults to the newest sweep under ./multirun; `python -m hpctrain COMMAND --help` for each.

Keys (override with key=value): lr, batch_size (global), grad_accum, max_steps, seed,
  precision (32|bf16|fp16), compile, log_every, eval_every, ckpt_every, objective.metric, objective.mode
{groups}
Sweeps: python -m hpctrain -m lr=1e-3,1e-4 seed=0,1   (hydra/launcher=local|slurm; default: slurm when
  sbatch is on PATH). Search: hydra/sweeper=search 'lr=tag(log, interval(1e-4, 1e-1))' hydra.sweeper.n_trials=20
Your own model or data: model._target_=pkg.module.Net data._target_=pkg.module.make_data

More: --cfg job (the composed config), --hydra-help (Hydra's own flags), --version, README.md.
"""


def _groups() -> str:
    """The config groups and their options, read from the shipped conf/ directory (no Hydra import)."""
    import os

    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conf")
    lines = ["Config groups (group=option):"]
    for group in sorted(os.listdir(conf)):
        folder = os.path.join(conf, group)
        if os.path.isdir(folder) and not group.startswith(("_", ".")):
            options = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".yaml"))
            extra = " (with -m: +sweep=NAME)" if group == "sweep" else ""
            lines.append(f"  {group}: {', '.join(options)}{extra}")
    return "\n".join(lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"hpctrain {v('hpctrain')} (hydra-core {v('hydra-core')}, submitit {v('submitit')}, torch {v('torch')})"


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


class _CompactErrors:
    """stderr, less Hydra's HYDRA_FULL_ERROR hint under a one-line error that is already the whole story, and
    with one line instead of a traceback for an error raised before any job ran (bad input: a config that
    does not compose or resolve, a file that does not load).

    Hydra writes while it handles the exception, so ``sys.exc_info()`` tells which error it follows; under a
    crash in the user's code (Hydra's ``run_job`` on the stack) the traceback and the hint stay, where they help.
    """

    HINT = "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.said: Optional[BaseException] = None

    def write(self, text: str) -> int:
        from hydra.errors import CompactHydraException

        exc = sys.exc_info()[1]
        if text.strip() == self.HINT and isinstance(exc, CompactHydraException):
            return len(text)
        if (exc is not None and not isinstance(exc, (CompactHydraException, SystemExit)) and not _in_job(exc)
                and _hydra_reports()):
            if exc is not self.said:  # the first of the traceback's pieces: one line for all of them
                self.said = exc
                self.stream.write(f"hpctrain: {_one_line(exc)}\n")
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


# errors of bad input: the message is the story; any other (a bug of hpctrain's own) also says how to see more
_INPUT_ERRORS = ("OmegaConfBaseException", "HydraException", "YAMLError", "ValueError", "TypeError", "KeyError",
                 "RecursionError", "UnicodeDecodeError", "OSError")


def _one_line(exc: BaseException) -> str:
    """``full_key: message`` on one line (OmegaConf's errors carry the key apart from the message)."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(
        ("full_key:", "object_type=", "reference_type="))]
    key = getattr(exc, "full_key", None)
    message = " ".join(lines) or type(exc).__name__
    message = message if len(message) < 400 else message[:397] + "..."
    if isinstance(exc, RecursionError):
        message = "nested too deep (RecursionError); expected a config of a few dozen levels"
    key = key or _where(exc)
    named = f"{key}: {message}" if key else message
    if not any(c.__name__ in _INPUT_ERRORS for c in type(exc).__mro__):
        named += f" ({type(exc).__name__}; set HYDRA_FULL_ERROR=1 for the traceback)"
    return named


# Hydra's steps that read one part of the config: the part named when the error itself names no key
_STEPS = {"instantiate_sweeper": "hydra.sweeper", "instantiate_launcher": "hydra.launcher"}


def _where(exc: BaseException) -> Optional[str]:
    tb, found = exc.__traceback__, None
    while tb is not None:
        found = _STEPS.get(tb.tb_frame.f_code.co_name, found)
        tb = tb.tb_next
    return found


def _hydra_reports() -> bool:
    """Whether this write is Hydra's report of the error (its ``run_and_report``, through ``traceback``), not
    a line some code prints while it handles an exception of its own."""
    frame = sys._getframe(2)  # the caller of write()
    while frame is not None and frame.f_code.co_filename.endswith("traceback.py"):
        frame = frame.f_back  # type: ignore[assignment]
    return frame is not None and frame.f_code.co_name == "run_and_report"


def _in_job(exc: BaseException) -> bool:
    """Whether the error came from inside a job (Hydra's ``run_job`` on its stack): the user's code."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "run_job":
            return True
        tb = tb.tb_next
    return False


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--help"], ["-h"], ["help"]) and len(argv) == 1:
        print(HELP.format(groups=_groups()))
        return
    if argv == ["--version"]:
        print(_version())
        return
    if argv[:1] == ["help"] and argv[1:2] and argv[1] in SUBCOMMANDS:
        argv = [argv[1], "--help"]
    if argv and argv[0] in SUBCOMMANDS:
        from hpctrain.review.cli import run_subcommand

        sys.exit(run_subcommand(argv))
    from hpctrain.submit.inputs import problems

    found = problems(argv)  # before Hydra reads a config file or an override: one line each, no traceback
    if found:
        print("\n".join(f"hpctrain: {p}" for p in found), file=sys.stderr)
        sys.exit(1)
    sys.argv = [sys.argv[0]] + pick_launcher(argv)
    from hpctrain.app import main as hydra_main

    stderr, sys.stderr = sys.stderr, _CompactErrors(sys.stderr)
    try:
        hydra_main()
    except KeyboardInterrupt:  # a Ctrl-C outside the local launcher's wait (which says more itself)
        print("hpctrain: interrupted (Ctrl-C)", file=stderr)
        sys.exit(130)
    finally:
        sys.stderr = stderr


if __name__ == "__main__":
    main()
