"""Checks of one composed config, cheap enough to run for every point of a 1000-run sweep.

Runs on the login node: no torch, and ``_target_`` classes are checked without importing them (the
module file is found on the import path and parsed), so nothing heavy is imported or built.
"""

import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any, List, Mapping, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpctrain.core import redact
from hpctrain.schema import OBJECTIVE_MODES, PRECISIONS, read_schedule


def validate_job(cfg: DictConfig, world_size: int = 1, plain: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Every problem of this config, each one line naming the key, the value and what is expected.

    ``plain``: the config already resolved to plain containers, when the caller has it (the launcher's
    plan shares one between a sweep's points); else it is resolved here.
    """
    problems: List[str] = []
    if plain is None:
        try:
            plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", "") or "config"
            return [f"{key}: {str(exc).splitlines()[0]}"]
    # the checks read the resolved plain copy: DictConfig attribute access cost more than the resolve
    cfg = _Plain(plain)  # type: ignore[assignment]

    def expect(ok: bool, key: str, what: str) -> None:
        if not ok:
            problems.append(f"{key}={_select(plain, key)!r}: expected {what}")

    expect(cfg.lr > 0, "lr", "a number > 0")
    expect(cfg.max_steps > 0, "max_steps", "an integer > 0")
    expect(cfg.batch_size > 0, "batch_size", "an integer > 0")
    expect(cfg.grad_accum >= 1, "grad_accum", "an integer >= 1")
    expect(str(cfg.precision) in PRECISIONS, "precision", f"one of {', '.join(PRECISIONS)}")
    expect(cfg.log_every >= 1, "log_every", "an integer >= 1")
    expect(cfg.eval_every >= 0, "eval_every", "an integer >= 0 (0: only at the end)")
    expect(cfg.eval_batches >= 0, "eval_batches", "an integer >= 0 (0: the whole validation set)")
    expect(cfg.ckpt_every >= 0, "ckpt_every", "an integer >= 0 (0: only at the end)")
    expect(cfg.warmup_steps >= 0, "warmup_steps", "an integer >= 0")
    expect(0 <= cfg.min_lr_ratio <= 1, "min_lr_ratio", "a number in [0, 1]")
    expect(cfg.grad_clip >= 0, "grad_clip", "a number >= 0 (0: no clipping)")
    expect(cfg.max_nonfinite >= 0, "max_nonfinite", "an integer >= 0 (0: the first NaN/Inf loss ends the run)")
    expect(cfg.hang_timeout_s is None or cfg.hang_timeout_s >= 0, "hang_timeout_s",
           "a number of seconds >= 0 (0: no hang watchdog; unset: derived from the step time)")
    for key in ("hang_first_step_s", "hang_eval_s", "hang_checkpoint_s"):
        expect(getattr(cfg, key) > 0, key, "a number of seconds > 0")
    expect(cfg.straggler_factor == 0 or cfg.straggler_factor > 1, "straggler_factor",
           "a number > 1 (x the other ranks' median work per step; 0: no straggler check)")
    expect(cfg.straggler_windows >= 1, "straggler_windows", "an integer >= 1 (log windows in a row)")
    expect(cfg.hang_setup_s is None or cfg.hang_setup_s > 0, "hang_setup_s",
           "a number of seconds > 0 (unset: hang_first_step_s)")
    expect(cfg.device in ("auto", "cpu", "cuda"), "device", "auto, cpu or cuda")
    expect(cfg.num_workers >= 0, "num_workers", "an integer >= 0")
    if cfg.batch_size > 0 and cfg.grad_accum >= 1 and cfg.batch_size % (world_size * cfg.grad_accum):
        problems.append(
            f"batch_size={cfg.batch_size}: expected a multiple of world_size x grad_accum = "
            f"{world_size} x {cfg.grad_accum} (the batch is global)"
        )
    train_size = _select(plain, "data.train_size")
    if isinstance(train_size, int) and cfg.batch_size > train_size:
        problems.append(f"batch_size={cfg.batch_size}: larger than data.train_size={train_size} "
                        f"(one step would need more samples than the data set has)")
    for key in ("num_classes", "num_features", "vocab_size", "seq_len", "train_size"):
        value = _select(plain, f"data.{key}")
        minimum = 2 if key in ("num_classes", "vocab_size") else 1
        if key == "num_classes" and _select(plain, "data.num_targets") is not None:
            minimum = 1  # a regression's output count (data=regression): one per target value
        if isinstance(value, int) and value < minimum:
            problems.append(f"data.{key}={value}: expected an integer >= {minimum}")
    shape = [_select(plain, f"data.{key}") for key in ("channels", "image_size", "num_features")]
    if all(isinstance(v, int) for v in shape) and shape[2] != shape[0] * shape[1] ** 2:
        problems.append(f"data.num_features={shape[2]}: expected channels x image_size x image_size = "
                        f"{shape[0] * shape[1] ** 2} (an image's flat size; leave it out to have it follow them)")
    for group in ("model", "data", "optim", "loss"):
        target = _select(plain, f"{group}._target_")
        error = target_error(target) if isinstance(target, str) else "a class path such as pkg.module.Class"
        if error:
            problems.append(f"{group}._target_={target!r}: {error}")
    assert plain is not None  # (resolved above)
    problems += _model_size_problems(plain)
    problems += _metrics_problems(plain)
    try:
        read_schedule(plain.get("schedule"), (plain.get("optim") or {}).keys())
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
    return problems


# the built-in models' size keys and their least values (a user's own model is its own judge)
MODEL_SIZES = {
    "hpctrain.train.models.mlp.MLP": {"hidden": 1, "depth": 0},
    "hpctrain.train.models.cnn.CNN": {"width": 1},
    "hpctrain.train.models.gpt.GPT": {"n_layer": 1, "n_head": 1, "n_embd": 1, "vocab_pad_to": 1},
}


def _model_size_problems(plain: Mapping[str, Any]) -> List[str]:
    model = plain.get("model") or {}
    least = MODEL_SIZES.get(str(model.get("_target_")), {})
    problems = [f"model.{key}={model[key]}: expected an integer >= {low}"
                for key, low in least.items() if isinstance(model.get(key), int) and model[key] < low]
    heads, width = model.get("n_head"), model.get("n_embd")
    if "n_head" in least and not problems and isinstance(heads, int) and isinstance(width, int) and width % heads:
        problems.append(f"model.n_embd={width}: expected a multiple of model.n_head={heads}")
    return problems


def logged_metrics(cfg: Mapping[str, Any]) -> List[str]:
    """The metric names a run of this config logs (val/* when the data has a validation split). ``cfg``: the
    composed config or its resolved plain copy."""
    names = ["train/loss", "train/lr", "val/loss"] + [f"val/{name}" for name in (cfg.get("metrics") or {})]
    return names + (["train/grad_norm"] if (cfg.get("grad_clip") or 0) > 0 else [])


def _metrics_problems(cfg: Mapping[str, Any]) -> List[str]:
    problems = []
    for name, node in (cfg.get("metrics") or {}).items():
        target = node.get("_target_") if isinstance(node, Mapping) else None
        error = target_error(target) if isinstance(target, str) else "expected {_target_: pkg.module.function}"
        if error:
            problems.append(f"metrics.{name}._target_={target!r}: {error}")
    objective = cfg.get("objective") or {}
    metric, mode = objective.get("metric"), objective.get("mode")
    if mode not in OBJECTIVE_MODES:
        problems.append(f"objective.mode={mode!r}: expected one of {', '.join(OBJECTIVE_MODES)}")
    if metric not in logged_metrics(cfg):
        problems.append(f"objective.metric={metric!r}: no run of this config logs it; expected one "
                        f"of {', '.join(logged_metrics(cfg))} (each of metrics.<name> logs val/<name>)")
    return problems


class _Plain:
    """Attribute access to a resolved config's plain dict (``cfg.lr``)."""

    def __init__(self, data: Any) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        value = self._data.get(name) if isinstance(self._data, dict) else None
        return _Plain(value) if isinstance(value, dict) else value


def _select(data: Any, key: str) -> Any:
    """``OmegaConf.select`` on the plain dict: None where any part of the dotted key is missing."""
    for part in key.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


@functools.lru_cache(maxsize=None)
def target_error(path: str) -> Optional[str]:
    """None when ``pkg.module.Name`` can be found, else what is wrong. Imports nothing."""
    module, _, name = path.rpartition(".")
    if not module or not name:
        return "expected a dotted path pkg.module.Name"
    source = _module_source(module)
    if source is None:
        return f"module {module!r} not found on the Python path"
    if source == "":
        return None  # an extension or namespace module: cannot look inside without importing it
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"module {module!r} does not parse: {exc}"
    if not _defines(tree, name):
        return f"module {module!r} has no {name!r}"
    kind = _constant_kind(tree, name)
    if kind:
        return f"{module}.{name} is a constant ({kind}), expected a callable (a class or function)"
    return None


_LITERALS = {ast.List: "list", ast.Dict: "dict", ast.Tuple: "tuple", ast.Set: "set", ast.JoinedStr: "str"}


def _constant_kind(tree: ast.Module, name: str) -> Optional[str]:
    """The type of the literal ``name`` is assigned at module level (``SCALE = 3``: "int"), else None."""
    kind = None
    for node in tree.body:
        value = None
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            value = node.value
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Import, ast.ImportFrom)):
            if any(n == name for n in _bound_names(node)):
                kind = None  # rebound to something callable later on
            continue
        if value is not None:
            kind = type(value.value).__name__ if isinstance(value, ast.Constant) else _LITERALS.get(type(value))
    return kind


def _bound_names(node: ast.stmt) -> List[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [alias.asname or alias.name.split(".")[-1] for alias in node.names]
    return [node.name]  # type: ignore[attr-defined]


def _module_source(module: str) -> Optional[str]:
    """The module's source text, '' if it exists without Python source, None if it is not there."""
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name is found without importing it
    if spec is None:
        return None
    path: Optional[Path] = Path(spec.origin) if spec.origin else None
    dirs = [Path(p) for p in (spec.submodule_search_locations or [])]
    for part in parts[1:]:
        for base in dirs:
            if (base / part / "__init__.py").is_file():
                path, dirs = base / part / "__init__.py", [base / part]
                break
            if (base / f"{part}.py").is_file():
                path, dirs = base / f"{part}.py", []
                break
            if (base / part).is_dir():  # namespace package
                path, dirs = None, [base / part]
                break
            if any(base.glob(f"{part}.*.so")):
                return ""
        else:
            return None
    if path is None or path.suffix != ".py":
        return ""
    return path.read_text(errors="replace")


def _defines(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[-1]) == name:
                    return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return True  # lazy module attributes: trust it
        if isinstance(node, (ast.If, ast.Try)):  # names bound under `if TYPE_CHECKING`/`try: import`
            inner = ast.Module(body=[n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)], type_ignores=[])
            if _defines(inner, name):
                return True
    return False


def unread_keys(cfg: Mapping[str, Any]) -> List[str]:
    """A warning per top-level key that hpctrain's app does not read (added with ``+key=value``), with the
    closest key it knows: ``+lerning_rate=1e-3`` trains at the default lr otherwise, silently."""
    return [f"{key}: {line}" for key in cfg.keys() if (line := unread_key(str(key)))]


def unread_key(key: str, swept: Optional[int] = None) -> Optional[str]:
    """What is wrong with a top-level ``key`` hpctrain's app does not read, None for one it reads.
    ``swept``: the number of values a sweep gives it (0: a search's interval)."""
    from dataclasses import fields

    from hpctrain.schema import TrainConfig
    from hpctrain.submit.keys import closest

    known = [f.name for f in fields(TrainConfig)]
    if key in known:
        return None
    near = closest(key, known)
    hint = f"; did you mean {near}?" if near else ""
    if swept is None:
        return f"hpctrain's app does not read this key, so it changes nothing{hint}"
    what = f"{swept} identical runs" if swept else "a search that explores nothing"
    return f"hpctrain's app does not read this key, so sweeping it gives {what}{hint}"


# ---------------------------------------------------------------- search schedulers (hydra.sweeper.scheduler)
SCHEDULERS = ("none", "asha", "hyperband", "pbt")  # as hpctrain.search.study.build_scheduler names them
TRIAL_API = ("hpctrain.trial", "hpctrain.search.api", "from hpctrain import trial")


def uses_trial_api(task_function: Any) -> Optional[bool]:
    """Whether a Hydra app can stop at a unit's end and resume: hpctrain's own app, or one whose source file
    names the trial API (:mod:`hpctrain.search.api`); None when its source cannot be read."""
    module = getattr(task_function, "__module__", "") or ""
    if module == "hpctrain.app" or module.startswith("hpctrain.app."):
        return True
    import inspect

    try:
        source = Path(inspect.getsourcefile(task_function) or "").read_text()
    except (OSError, TypeError):
        return None
    return any(name in source for name in TRIAL_API)


def scheduler_problems(conf: Mapping[str, Any], max_steps: Any, eval_every: Any, uses_api: Optional[bool],
                       app: str = "the app") -> List[str]:
    """The scheduler's settings against the app's config, one line per problem (nothing submitted)."""
    name = conf.get("scheduler", "none")
    if name not in SCHEDULERS:
        return [f"hydra.sweeper.scheduler={name}: unknown scheduler (expected one of {', '.join(SCHEDULERS)})"]
    if name == "none":
        return []
    problems: List[str] = []
    if uses_api is False:
        return [f"hydra.sweeper.scheduler={name}: {app} does not use hpctrain's trial API (hpctrain.trial: "
                f"end_step, report, save_state), so it cannot pause at a unit's end; use scheduler=none"]
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        return [f"hydra.sweeper.scheduler={name}: {app}'s config has no integer max_steps (the last rung or "
                f"interval); got {max_steps!r}"]
    every = eval_every if isinstance(eval_every, int) and not isinstance(eval_every, bool) and eval_every > 0 else None
    if name in ("asha", "hyperband"):
        eta, first = conf.get("eta"), conf.get("min_steps") or every
        if not isinstance(eta, int) or isinstance(eta, bool) or eta < 2:
            problems.append(f"hydra.sweeper.eta={eta}: expected an integer >= 2 (the top 1/eta of a rung is promoted)")
        if not isinstance(first, int) or isinstance(first, bool) or first < 1:
            problems.append(f"hydra.sweeper.min_steps={first}: expected an integer >= 1 (the first rung)")
        elif first >= max_steps:
            problems.append(f"hydra.sweeper.min_steps={first}: expected fewer than max_steps={max_steps} "
                            f"(the first rung comes before the end)")
        elif every and first % every:
            problems.append(f"hydra.sweeper.min_steps={first}: expected a multiple of eval_every={every} "
                            f"(the objective is read at each rung)")
    if name == "pbt":
        population, interval = conf.get("population"), conf.get("interval") or every
        if not isinstance(population, int) or isinstance(population, bool) or population < 2:
            problems.append(f"hydra.sweeper.population={population}: expected an integer >= 2")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            problems.append(f"hydra.sweeper.interval={interval}: expected an integer >= 1 (steps between decisions)")
        elif every and (interval < every or interval % every):
            problems.append(f"hydra.sweeper.interval={interval}: expected a multiple of eval_every={every} "
                            f"(a decision needs an objective)")
        q, p = conf.get("quantile"), conf.get("resample_p")
        if not isinstance(q, (int, float)) or not 0 < float(q) <= 0.5:
            problems.append(f"hydra.sweeper.quantile={q}: expected a number in (0, 0.5]")
        if not isinstance(p, (int, float)) or not 0 <= float(p) <= 1:
            problems.append(f"hydra.sweeper.resample_p={p}: expected a number in [0, 1]")
    return problems


# ---------------------------------------------------------------- what reaches the job script (hydra.launcher.*)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_DATA = "a newline would end the job script's #SBATCH block and run the rest as commands"


def script_field_problems(params: Mapping[str, Any], paths: Mapping[str, str]) -> List[str]:
    """Every launcher setting, key and path that the job script holds, checked as data: no control
    characters anywhere (one line per key), ``env`` names identifiers, sbatch option names plain; and no
    secret in ``env`` (it would be written into the script). ``paths``: the other fields the script holds
    (``hydra.sweep.dir``, the launch directory), by the name to report."""
    problems: List[str] = []
    for name, text in paths.items():
        if _CONTROL.search(text):
            problems.append(f"{name}={text!r}: expected no control characters ({_DATA})")
    _walk(params, "hydra.launcher", problems)
    for name in (params.get("env") or {}):
        if not _ENV_NAME.match(str(name)):
            problems.append(f"hydra.launcher.env.{name!r}: expected an environment variable name (letters, digits, _)")
        elif redact.is_secret_key(str(name)):
            problems.append(f"hydra.launcher.env.{name}: looks like a secret; it would be written to the job script. "
                            f"Export it in your shell instead (Slurm passes your environment to the job)")
    for name in (params.get("additional_parameters") or {}):
        if not _SBATCH_OPTION.match(str(name)) and not _CONTROL.search(str(name)):  # (control: said above)
            problems.append(f"hydra.launcher.additional_parameters.{name!r}: expected an sbatch option name "
                            f"(letters, digits, - and _)")
    return problems


def _walk(node: Any, key: str, problems: List[str]) -> None:
    if isinstance(node, Mapping):
        for name, value in node.items():
            if _CONTROL.search(str(name)):
                problems.append(f"{key}.{str(name)!r}: expected a key without control characters ({_DATA})")
            else:
                _walk(value, f"{key}.{name}", problems)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _walk(value, f"{key}[{i}]", problems)
    elif isinstance(node, str) and _CONTROL.search(node):
        problems.append(f"{key}={node!r}: expected no control characters ({_DATA})")
