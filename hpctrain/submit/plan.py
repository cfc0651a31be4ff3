"""Turn a sweep's override lists into runs: their configs, directories and names, fast.

Hydra's own launchers compose every point from scratch (tens of ms each: 40+ s for 1000 points).
Here a point's config-group choices (``model=cnn``) are composed by Hydra once per distinct set, and
the plain value overrides (``lr=1e-3``) are applied with Hydra's own override machinery, so the type
checks of the structured configs still apply. The job on the compute node composes its config again
with Hydra in full; this plan only validates and names runs.

What keeps 10,000 points fast (profiled: per-point deep copies, Hydra's override parser and the
interpolation grammar were nearly all of the time):
- each distinct override string is parsed once (a 10,000-point grid has a few hundred);
- points that set the same keys to plain values (``lr=...,seed=...``) share ONE working config: each
  point's values replace the previous point's, the point is checked (``inspect``) right then, and its
  own config is only built again when someone asks for ``PlannedRun.cfg``;
- the resolved plain copy that validation reads is made once per composed base; each point's copy shares
  it, with the point's own values, and the interpolated values that may read them, set along their paths
  (OmegaConf's ``to_container`` of the whole config per point was a third of the time);
- a point applies, and reads back, only the values that differ from the previous point's;
- the run dir name is filled in from ``hydra.sweep.subdir`` by plain substitution when that template
  only uses ``${hydra.job.*}`` values (Hydra's default) or is hpctrain's own name template, else resolved
  by OmegaConf, with OmegaConf's interpolation grammar parsed once per distinct string while the plan is
  made (:func:`hpctrain.interpolation_parser_memoized`: ANTLR parsing was 2 ms per interpolation).
"""

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from hpctrain._compat.hydra import apply_overrides, group_checker
from hpctrain._compat.omegaconf import interpolation_parser_memoized
from hpctrain.core.run import RunSpec
from hpctrain.schema import DIRNAME_TEMPLATE
from hpctrain.schema import dirname as hpctrain_dirname
from hpctrain.submit import naming

# A point's problems, checked while its config is at hand: (its config, its resolved plain copy when the
# plan has one at hand cheaply, else None).
Inspect = Callable[[DictConfig, Optional[Dict[str, Any]]], List[str]]
_UNSET: Any = object()


@dataclass
class PlannedRun:
    """A planned run: its :class:`~hpctrain.core.run.RunSpec` (what is handed to the job) and, built only
    when read, the app's config for it."""

    spec: RunSpec
    _make_cfg: Optional[Callable[[], DictConfig]] = field(default=None, repr=False)
    _cfg: Optional[DictConfig] = field(default=None, repr=False)

    @property
    def cfg(self) -> DictConfig:
        """The app's config for this point (no hydra node): what the task function gets. Built on demand."""
        if self._cfg is None:
            assert self._make_cfg is not None
            self._cfg = self._make_cfg()
        return self._cfg

    @property
    def idx(self) -> int:
        return self.spec.idx

    @property
    def overrides(self) -> List[str]:
        return list(self.spec.overrides)

    @property
    def run_dir(self) -> Path:
        return self.spec.run_dir

    @property
    def max_steps(self) -> Optional[int]:
        return self.spec.max_steps

    @property
    def name(self) -> str:
        return self.spec.name


def make_spec(idx: int, overrides: Sequence[str], run_dir: Path, max_steps: Any = None) -> RunSpec:
    """A RunSpec from what the plan found (``max_steps`` kept only where it is an integer)."""
    number = isinstance(max_steps, (int, float)) and not isinstance(max_steps, bool)
    steps = int(max_steps) if number else None
    return RunSpec(idx=idx, overrides=tuple(overrides), run_dir=Path(run_dir).absolute(), max_steps=steps)


@dataclass
class _Base:
    """One composed config per distinct set of config-group choices, split for cheap per-point copies."""

    task: DictConfig
    subdir: Any  # hydra.sweep.subdir, unresolved
    sweep_dir: str
    job_name: str
    dirname: Dict[str, Any]  # hydra.job.config.override_dirname
    template: Optional[List[Tuple[str, Optional[str]]]]  # subdir as (text, hydra.job key) pieces; None: resolve
    typed_template: Optional[List[Tuple[str, Optional[str]]]] = None  # the app's own subdir (older sweeps' names)
    working: Dict[Tuple[str, ...], "_Working"] = field(default_factory=dict)  # shared config per set of keys
    naming: Optional[DictConfig] = None  # hydra.job values and hydra.sweep.subdir, to resolve run dir names
    plain: Any = _UNSET  # ``task`` resolved to plain containers, and where it holds interpolations
    readers: Dict[Tuple[str, ...], List[str]] = field(default_factory=dict)  # per key set: interpolations to redo
    _sweep_dir_exists: Optional[bool] = None

    def sweep_dir_exists(self) -> bool:
        """Whether the sweep dir is there already (a rerun): asked once per base."""
        if self._sweep_dir_exists is None:
            self._sweep_dir_exists = Path(self.sweep_dir).is_dir()
        return self._sweep_dir_exists

    def resolved(self) -> Optional[Tuple[Dict[str, Any], List[Tuple[str, str]]]]:
        """``task`` as plain containers (made once), and the dotted key and text of each interpolated value
        (a point resolves again those that may read its values); None when the shortcut does not hold (a
        missing value, an interpolation inside a list)."""
        if self.plain is _UNSET:
            paths: List[Tuple[str, str]] = []
            raw = OmegaConf.to_container(self.task, resolve=False)
            plain = _try_resolve(self.task) if _interpolated(raw, "", paths) else None
            self.plain = (plain, paths) if plain is not None else None
        return self.plain


@dataclass
class _Working:
    """The config shared by the points that set one set of keys, and what is in it now: per key, the
    override line last applied and (once read) the value it left, so that a point applies and reads
    only the values that differ from the previous point's (in a grid most stay the same)."""

    cfg: DictConfig
    lines: Dict[str, str] = field(default_factory=dict)
    values: Dict[str, Any] = field(default_factory=dict)


class OverrideCache:
    """Hydra's override parser, once per distinct override string."""

    def __init__(self) -> None:
        self.parser = OverridesParser.create()
        self.parsed: Dict[str, Any] = {}

    def __call__(self, overrides: Sequence[str]) -> List[Any]:
        out = []
        for line in overrides:
            o = self.parsed.get(line)
            if o is None:
                o = self.parsed[line] = self.parser.parse_overrides([line])[0]
            out.append(o)
        return out


def plan_runs(ctx: HydraContext, config: DictConfig, job_overrides: Sequence[Sequence[str]],
              first_idx: int, inspect: Optional[Inspect] = None,
              by_values: bool = False) -> Tuple[List[PlannedRun], List[str]]:
    """The runs of the good points, and one line per bad point (all of them, not just the first).

    ``inspect`` is called on every point's config (validation): its lines are that point's problems.
    ``by_values``: an app that keeps Hydra's default subdir gets run dirs named by its swept values.
    """
    with interpolation_parser_memoized():
        return _plan(ctx, config, job_overrides, first_idx, inspect, by_values)


def _plan(ctx: HydraContext, config: DictConfig, job_overrides: Sequence[Sequence[str]],
          first_idx: int, inspect: Optional[Inspect], by_values: bool = False) -> Tuple[List[PlannedRun], List[str]]:
    loader = ctx.config_loader
    parse = OverrideCache()
    group_exists = group_checker(loader)
    is_group: Dict[str, bool] = {}
    bases: Dict[Tuple[str, ...], _Base] = {}
    runs: List[PlannedRun] = []
    errors: List[str] = []
    for offset, overrides in enumerate(job_overrides):
        idx = first_idx + offset
        try:
            parsed = parse(overrides)
            if any(o.key_or_group.startswith("hydra") for o in parsed):
                run_dir, cfg = _full_compose(loader, config, parsed, idx, list(overrides))  # rare: Hydra itself swept
                plain, make = None, None
            else:
                for o in parsed:
                    if o.key_or_group not in is_group:
                        is_group[o.key_or_group] = group_exists(o.key_or_group.split("@")[0])
                groups = tuple(o.input_line for o in parsed if is_group[o.key_or_group])
                if groups not in bases:
                    bases[groups] = _split(loader.load_sweep_config(config, list(groups)), by_values)
                base = bases[groups]
                values = [o for o in parsed if not is_group[o.key_or_group]]
                cfg = _point_config(base, values)
                plain = _point_plain(base, values, cfg) if inspect is not None else None
                run_dir, make = _run_dir(base, parsed, idx), _maker(base, values)
            steps = plain.get("max_steps") if plain is not None else OmegaConf.select(cfg, "max_steps", default=None)
            run = PlannedRun(make_spec(idx, overrides, run_dir, steps), _make_cfg=make, _cfg=None if make else cfg)
            problems = inspect(cfg, plain) if inspect is not None else []
        except Exception as exc:  # noqa: BLE001 - every bad point is reported, not just the first
            errors.append(f"run {idx} ({' '.join(overrides)}): {_one_line(exc)}")
            continue
        errors += [f"run {idx} ({' '.join(overrides) or 'no overrides'}): {p}" for p in problems]
        runs.append(run)
    return runs, placement_problems(runs, bases) + errors


def placement_problems(runs: Sequence[PlannedRun], bases: Dict[Tuple[str, ...], _Base]) -> List[str]:
    """One line when a run dir falls outside its sweep dir (``hydra.sweep.subdir=../x``, an absolute one),
    and one naming the first two points that share a run dir (``hydra.sweep.subdir=same``): the second
    would resume from the first's state."""
    inside = tuple({os.path.normpath(os.path.abspath(b.sweep_dir)) + os.sep for b in bases.values()})
    seen: Dict[str, PlannedRun] = {}
    out: List[str] = []
    for run in runs:
        where = str(run.run_dir)  # absolute already; normalized only where it may hold a '..' or '//'
        if "/." in where or "//" in where:
            where = os.path.normpath(where)
        if not where.startswith(inside) and not out:
            subdir = next(iter(bases.values())).subdir if bases else "?"
            out.append(f"hydra.sweep.subdir={subdir!r}: run {run.idx}'s dir {where} is not inside the sweep dir; "
                       f"expected a relative path below it, such as ${{hydra.job.num}}")
        first = seen.setdefault(where, run)
        if first is not run:
            shared = sum(1 for r in runs if os.path.normpath(str(r.run_dir)) == os.path.normpath(where))
            return out + [f"run {first.idx} ({' '.join(first.overrides)}) and run {run.idx} ({' '.join(run.overrides)}) "
                          f"have the same run dir {where} ({shared} points in all share it): expected "
                          f"hydra.sweep.subdir to differ per point, such as ${{hydra.job.num}}"]
    return out


def _plain(o: Any) -> bool:
    """An override that sets an existing key to a plain value: applying it again replaces it wholly."""
    return o.type in (OverrideType.CHANGE, OverrideType.FORCE_ADD) and not isinstance(o.value(), (dict, list))


def _point_config(base: _Base, values: List[Any]) -> DictConfig:
    """The point's config: the working config its key set shares, when all its values are plain (each
    point replaces every one of them); else a copy of its own."""
    if not values or not all(_plain(o) for o in values):
        cfg = copy.deepcopy(base.task)
        apply_overrides(values, cfg)
        return cfg
    keys = tuple(o.key_or_group for o in values)
    work = base.working.get(keys)
    if work is None:
        work = _Working(copy.deepcopy(base.task))
    changed = [o for o in values if work.lines.get(o.key_or_group) != o.input_line]
    try:
        apply_overrides(changed, work.cfg)  # raises on a bad value: the point's error
    except Exception:
        work.lines.clear()  # partly applied: the next point applies all of its values
        work.values.clear()
        raise
    for o in changed:
        work.lines[o.key_or_group] = o.input_line
        work.values.pop(o.key_or_group, None)
    base.working[keys] = work  # only once a point applied cleanly
    return work.cfg


def _point_plain(base: _Base, values: List[Any], cfg: DictConfig) -> Optional[Dict[str, Any]]:
    """The point's resolved plain copy, from its base's: containers are copied only along the paths of the
    point's keys and of the config's interpolated values, each set to what OmegaConf gives for it in ``cfg``
    (the point's values as Hydra's override machinery stored them, converted and type-checked).
    None where the shortcut does not hold: the caller resolves the whole config."""
    resolved = base.resolved()
    if resolved is None or not values or not all(_plain(o) for o in values):
        return None
    base_plain, interpolated = resolved
    keys = tuple(o.key_or_group for o in values)
    if any("[" in key for key in keys) or any(isinstance(o.value(), str) and "${" in o.value() for o in values):
        return None  # an indexed key, or a value that is an interpolation: resolved whole
    readers = base.readers.get(keys)
    if readers is None:
        readers = base.readers[keys] = [path for path, text in interpolated if _may_read(text, keys)]
    work = base.working[keys]
    plain = dict(base_plain)
    try:
        for key in keys + tuple(readers):
            *parents, leaf = key.split(".")
            node = plain
            for name in parents:
                child = node.get(name)
                if not isinstance(child, dict):
                    return None
                node[name] = node = dict(child)
            value = work.values.get(key, _UNSET) if key in work.lines else _UNSET  # this point's own keys
            if value is _UNSET:
                value = OmegaConf.select(cfg, key, throw_on_missing=True)
                if OmegaConf.is_config(value):
                    value = OmegaConf.to_container(value, resolve=True)
                if key in work.lines:
                    work.values[key] = value
            node[leaf] = value
    except Exception:  # noqa: BLE001 - resolved whole by the caller, which reports it
        return None
    return plain


def _may_read(text: str, keys: Sequence[str]) -> bool:
    """Whether the interpolation ``text`` may read one of ``keys`` (or a node above one): True when any
    of their dotted prefixes appears in it, and always for a resolver call (``${name:...}``, which may
    read any node) or a relative reference (``${.x}``). Over-cautious is only slower."""
    if ":" in text or "${." in text:
        return True
    parts = [part for key in keys for part in _prefixes(key.lstrip("+~"))]
    return any(part in text for part in parts)


def _prefixes(key: str) -> List[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``."""
    names = key.split(".")
    return [".".join(names[:i]) for i in range(1, len(names) + 1)]


def _interpolated(raw: Any, prefix: str, paths: List[Tuple[str, str]]) -> bool:
    """Collect the dotted key and text of each interpolated value in ``raw`` (``to_container(resolve=False)``)
    into ``paths``; False when one sits inside a list (not addressed by a dotted key here)."""
    if isinstance(raw, dict):
        return all(_interpolated(v, f"{prefix}{k}.", paths) for k, v in raw.items())
    if isinstance(raw, list):
        return not any(_interpolated_any(v) for v in raw)
    if isinstance(raw, str) and "${" in raw:
        paths.append((prefix[:-1], raw))
    return True


def _interpolated_any(raw: Any) -> bool:
    if isinstance(raw, dict):
        return any(_interpolated_any(v) for v in raw.values())
    if isinstance(raw, list):
        return any(_interpolated_any(v) for v in raw)
    return isinstance(raw, str) and "${" in raw


def _try_resolve(cfg: DictConfig) -> Optional[Dict[str, Any]]:
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - a missing value: each point is resolved (and reported) whole
        return None


def _maker(base: _Base, values: List[Any]) -> Callable[[], DictConfig]:
    def make() -> DictConfig:
        cfg = copy.deepcopy(base.task)
        apply_overrides(values, cfg)
        return cfg

    return make


def _split(full: DictConfig, by_values: bool = False) -> _Base:
    task = copy.deepcopy(full)
    with open_dict(task):
        del task["hydra"]
    sweep: Any = OmegaConf.to_container(full.hydra.sweep, resolve=False)
    subdir = sweep["subdir"]
    return _Base(
        task=task,
        subdir=subdir,
        sweep_dir=str(full.hydra.sweep.dir),
        job_name=str(full.hydra.job.name),
        dirname=OmegaConf.to_container(full.hydra.job.config.override_dirname, resolve=True),  # type: ignore[arg-type]
        template=_template(_named_by_values(full, subdir) if by_values else subdir),
        typed_template=_template(subdir),
    )


HYDRA_SUBDIR = "${hydra.job.num}"  # Hydra's own hydra.sweep.subdir: run dirs 0, 1, 2


def job_id_note(config: DictConfig) -> Optional[str]:
    """One line when ``hydra.sweep.subdir`` names ``${hydra.job.id}``: a run's dir is decided before its job
    exists, so ``plan_N`` (N its index) stands in for the job id there, in the dir and in the job's config."""
    subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir")  # type: ignore[union-attr]
    if not isinstance(subdir, str) or "hydra.job.id" not in subdir:
        return None
    return ("hydra.sweep.subdir uses ${hydra.job.id}: run dirs hold plan_N (N: the run's index) in its place, as a "
            "run's dir is decided before its job exists (the job id is in sweep.json and `status`)")


def _named_by_values(full: DictConfig, subdir: Any) -> Any:
    """Hydra's default subdir (a user's app that keeps it) becomes hpctrain's: run dirs named by index and
    swept values, as for hpctrain's own app. A subdir the command line sets is kept as it is."""
    typed: Any = OmegaConf.to_container(full.hydra.overrides.hydra, resolve=False)  # as typed: not resolved here
    if subdir != HYDRA_SUBDIR or any(str(o).lstrip("+").startswith("hydra.sweep.subdir=") for o in typed):
        return subdir
    return DIRNAME_TEMPLATE


_JOB_REF = re.compile(r"\$\{hydra\.job\.(num|id|name|override_dirname)\}")


def _template(subdir: Any) -> Optional[List[Tuple[str, Optional[str]]]]:
    """``"${hydra.job.num}_${hydra.job.override_dirname}"`` -> text and key pieces; None when the template
    uses anything else (another interpolation, a resolver, escapes): then OmegaConf resolves it.
    hpctrain's own template (its resolver over those two values) is one piece, ``hpctrain``."""
    if subdir == DIRNAME_TEMPLATE:
        return [("", "hpctrain")]
    if not isinstance(subdir, str):
        return None
    pieces: List[Tuple[str, Optional[str]]] = []
    at = 0
    for m in _JOB_REF.finditer(subdir):
        pieces += [(subdir[at:m.start()], None), ("", m.group(1))]
        at = m.end()
    pieces.append((subdir[at:], None))
    if any("$" in text or "\\" in text for text, _ in pieces):
        return None
    return pieces


def _run_dir(base: _Base, parsed: List[Any], idx: int) -> Path:
    """Resolve hydra.sweep.subdir for one point from the few values it may use (as run_job would); named by
    the parsed values. A run dir an older sweep named by the lines as typed is kept (a rerun finds it)."""
    seps = (base.dirname["exclude_keys"], base.dirname["item_sep"], base.dirname["kv_sep"])
    dirname = naming.override_dirname(parsed, *seps)
    run_dir = _subdir(base, idx, dirname)
    typed = naming.legacy(parsed, *seps)
    if (typed != dirname or base.typed_template != base.template) and base.sweep_dir_exists() and not run_dir.exists():
        older = _subdir(base, idx, typed, base.typed_template)
        if older.exists():
            return older
    return run_dir


def _subdir(base: _Base, idx: int, dirname: str, template: Any = _UNSET) -> Path:
    template = base.template if template is _UNSET else template
    if template is not None:
        job = {"num": str(idx), "id": f"plan_{idx}", "name": base.job_name, "override_dirname": dirname}
        if template == [("", "hpctrain")]:
            return Path(base.sweep_dir) / hpctrain_dirname(idx, dirname)
        return Path(base.sweep_dir) / "".join(text if key is None else job[key] for text, key in template)
    if base.naming is None:  # one naming config per base; each point sets its values into it
        base.naming = OmegaConf.create({"hydra": {
            "job": {"num": idx, "id": "", "name": base.job_name, "override_dirname": ""},
            "sweep": {"dir": base.sweep_dir, "subdir": base.subdir},
        }})
    job = base.naming.hydra.job
    job.num, job.id, job.override_dirname = idx, f"plan_{idx}", dirname
    return Path(base.sweep_dir) / str(base.naming.hydra.sweep.subdir)


def _full_compose(loader: Any, config: DictConfig, parsed: List[Any], idx: int,
                  overrides: List[str]) -> Tuple[Path, DictConfig]:
    cfg = loader.load_sweep_config(config, overrides)
    job = cfg.hydra.job
    with open_dict(job):
        job.num, job.id = idx, f"plan_{idx}"
        job.override_dirname = naming.override_dirname(
            parsed, exclude_keys=list(job.config.override_dirname.exclude_keys),
            item_sep=job.config.override_dirname.item_sep, kv_sep=job.config.override_dirname.kv_sep)
    run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    return run_dir, _split(cfg).task


def constant_keys(job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """The keys every point sets to the same value (none for a sweep of one point): left out of run-dir
    names, which then say what varies. Decided over the whole sweep, not per batch of it."""
    if len(job_overrides) < 2:
        return []
    parse = OverrideCache()
    values: Dict[str, List[str]] = {}
    for overrides in job_overrides:
        for o in parse(overrides):
            values.setdefault(o.key_or_group, []).append(o.input_line)
    return [k for k, v in values.items() if len(v) == len(job_overrides) and len(set(v)) == 1]


def exclude_from_names(config: DictConfig, keys: Sequence[str]) -> None:
    """Leave ``keys`` out of ``hydra.job.override_dirname``; also as a Hydra override, so that the job's
    own config (composed again from the sweep's Hydra overrides) holds the same ``override_dirname``."""
    if not keys:
        return
    dirname = config.hydra.job.config.override_dirname
    merged = list(dict.fromkeys(list(dirname.exclude_keys) + list(keys)))
    quoted = ",".join(f"'{k}'" for k in merged)
    with open_dict(config):
        dirname.exclude_keys = merged
        config.hydra.overrides.hydra.append(f"hydra.job.config.override_dirname.exclude_keys=[{quoted}]")


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    if exc.__cause__ is not None:  # Hydra's "Error merging override x=y" holds the reason in its cause
        text += f": {exc.__cause__}"
    text = " ".join(text.split())
    return text if len(text) < 400 else text[:397] + "..."
