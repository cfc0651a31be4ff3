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

Keys (override with key=value; `--cfg job` shows their values):
{keys}
{groups}
Sweeps: python -m hpctrain -m lr=1e-3,1e-4 seed=0,1   (hydra/launcher=local|slurm; default: slurm when
  sbatch is on PATH). Search: hydra/sweeper=search 'lr=tag(log, interval(1e-4, 1e-1))' hydra.sweeper.n_trials=20
Your own model or data: model._target_=pkg.module.Net data._target_=pkg.module.make_data

More: --cfg job (the composed config), --hydra-help (Hydra's own flags), --version, README.md.
"""


# every key of hpctrain.schema.TrainConfig, one line each (a test fails on a schema key left out)
KEYS = {
    "lr": "base learning rate (3e-3)",
    "batch_size": "global batch: world_size x grad_accum x micro-batch (64)",
    "grad_accum": "micro-batches per optimizer step (1)",
    "max_steps": "optimizer steps in the run (200)",
    "warmup_steps": "linear warm-up steps before the cosine decay (10)",
    "min_lr_ratio": "the cosine decays to lr x min_lr_ratio (0.1)",
    "schedule": "[{step: N, lr: ...}]: values from step N on (a PBT schedule replayed)",
    "grad_clip": "clip the gradient norm to this; 0: no clipping (1.0)",
    "seed": "seed of the model's init and the data order (0)",
    "precision": "32 | bf16 | fp16 (32)",
    "compile": "torch.compile the model (false)",
    "device": "auto | cpu | cuda (auto: cuda when there is one)",
    "num_workers": "data loader worker processes (0)",
    "log_every": "steps between train/* logs and progress lines (10)",
    "eval_every": "steps between evaluations; 0: at the end only (100)",
    "eval_batches": "micro-batches per evaluation; 0: the whole validation set (20)",
    "ckpt_every": "steps between checkpoints; 0: at the end (and on preemption) only (100)",
    "max_nonfinite": "log steps in a row a NaN/Inf loss may last before the run fails (0)",
    "hang_timeout_s": "seconds without a step before a run is called hung; 0: off (max(300, 10x the step time))",
    "hang_setup_s": "allowance for the setup: process group, model, data, checkpoint load (hang_first_step_s)",
    "hang_first_step_s": "allowance for the first steps, a compile included (1800)",
    "hang_eval_s": "allowance for one evaluation (1800)",
    "hang_checkpoint_s": "allowance for one checkpoint save (900)",
    "straggler_factor": "flag a rank whose own work per step is this x the others' median; 0: off (1.3)",
    "straggler_windows": "... in this many log windows in a row (3)",
    "objective": "objective.metric (val/loss) and objective.mode (min | max): what a sweep optimises",
    "metrics": "name -> {_target_: fn(outputs, targets)}: each logs val/<name> (group below)",
    "model": "model.<key>, or model._target_=pkg.module.Net for your own (group below)",
    "data": "data.<key>, or data._target_=pkg.module.make_data for your own (group below)",
    "optim": "optim.<key> (optim.weight_decay, ...), or optim._target_ (group below)",
    "loss": "loss._target_ (group below)",
}


def _keys() -> str:
    width = max(len(k) for k in KEYS)
    return "\n".join(f"  {key:<{width}}  {text}" for key, text in KEYS.items())


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
    return [f"hydra/launcher={choice}"] + argv


def overrides_first(argv: List[str]) -> List[str]:
    """``argv`` with its overrides moved before Hydra's flags: Hydra's parser takes overrides as one run of
    words, so one after ``--cfg job`` or ``--info`` is refused with its usage text (or swallowed as the flag's
    value)."""
    from hpctrain._compat.hydra import hydra_args

    args = hydra_args(argv)
    if args is None:
        return argv  # Hydra's parser says what is wrong
    given, rest, i = list(args.overrides), [], 0
    for k, arg in enumerate(argv):
        before = argv[k - 1] if k else ""
        flag_value = before in _WITH_VALUE and not arg.startswith("-") and (before not in ("--info", "-i")
                                                                            or "=" not in arg)
        if i < len(given) and arg == given[i] and not flag_value:
            i += 1
        else:
            rest.append(arg)
    return given + rest


_WITH_VALUE = ("--cfg", "-c", "--info", "-i", "--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn",
               "--package", "-p", "--experimental-rerun")
_SHOW = ("--cfg", "-c", "--info", "-i")  # Hydra's flags that print a config or facts instead of running


def shown_once(argv: List[str]) -> List[str]:
    """``-m ... --cfg job``: Hydra takes only one of -m, --cfg and --info (a traceback otherwise); --cfg and
    --info compose one config, so -m is dropped. A sweep has no one config: refused in one line."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if not multirun or not any(a.split("=", 1)[0] in _SHOW for a in argv):
        return argv
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hpctrain._compat.hydra import hydra_args

    args = hydra_args(argv)
    try:
        swept = [o for o in OverridesParser.create().parse_overrides(list(args.overrides) if args else [])
                 if o.is_sweep_override()]
    except Exception:  # noqa: BLE001 - Hydra's grammar error is one line already
        swept = []
    if swept:
        o = swept[0]
        raise _FlagRefused(f"{o.get_key_element()}: --cfg and --info show one config, and {o.input_line} is a sweep; "
                       f"give it one value to see that run's config")
    return [a for a in argv if a not in ("-m", "--multirun")]


class _FlagRefused(Exception):
    """A command line refused before Hydra runs: its one line."""


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


def _too_large(overrides: List[Any]) -> Optional[str]:
    """A sweep with more points than hpctrain plans, refused before anything is composed (the sweeper checks
    again against the launcher's queue)."""
    from hpctrain.submit.sweeper import size_problem

    try:
        problem = size_problem(overrides, None)
    except Exception:  # noqa: BLE001 - values listed only by Hydra's loader (a glob): the sweeper counts them
        return None
    return f"nothing submitted: {problem}" if problem else None


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--help"], ["-h"], ["help"]) and len(argv) == 1:
        print(HELP.format(keys=_keys(), groups=_groups()))
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
    argv = pick_launcher(overrides_first(argv))
    try:
        argv = shown_once(argv)
    except _FlagRefused as exc:
        print(f"hpctrain: {exc}", file=sys.stderr)
        sys.exit(1)
    from hpctrain._compat.hydra import compositions_shared, mode_composed_once
    from hpctrain.schema import register_configs
    from hpctrain.submit.checks import unread_key
    from hpctrain.submit.keys import command_line_problems

    register_configs()  # the schema the app's config names (hpctrain.app registers it too, on import)
    with compositions_shared():  # the key check's, Hydra's and the plan's compositions: the same groups
        found = command_line_problems(argv, "pkg://hpctrain.conf", "config", unread=unread_key,  # once per key
                                      before=_too_large)
        if found:
            print("\n".join(f"hpctrain: {p}" for p in found), file=sys.stderr)
            sys.exit(1)
        sys.argv = [sys.argv[0]] + argv
        from hpctrain.app import main as hydra_main

        stderr, sys.stderr = sys.stderr, _CompactErrors(sys.stderr)
        try:
            with mode_composed_once():  # -m: Hydra's get_mode and multirun compose the same config
                hydra_main()
        except KeyboardInterrupt:  # a Ctrl-C outside the local launcher's wait (which says more itself)
            print("hpctrain: interrupted (Ctrl-C)", file=stderr)
            sys.exit(130)
        finally:
            sys.stderr = stderr

if __name__ == "__main__":
    main()
