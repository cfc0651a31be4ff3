"""The command line and the config files it brings, checked before Hydra reads them: one line per problem.

Hydra builds whatever YAML says (an alias nested nine deep expands to a billion nodes: the login node
hangs) and answers an override of a config group by a number, or a value nested hundreds deep, with a
traceback. Here a user's config dirs (``--config-dir``, ``--config-path``, ``hydra.searchpath``) are read
as YAML nodes, never built: aliases counted as they would expand, tags other than plain YAML's refused;
and each override is parsed once with Hydra's own parser.
"""

import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import yaml

MAX_NODES = 100_000  # nodes a config file may expand to (aliases counted as copies)
MAX_FILES = 2_000  # YAML files read per config dir
MAX_DEPTH = 32  # levels an override's value may nest
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in (
    "null", "bool", "int", "float", "str", "map", "seq", "merge", "timestamp", "binary", "omap", "pairs", "set",
    "value"))
_FLAGS_WITH_VALUE = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "--package", "-p",
                     "--experimental-rerun", "--info", "--cfg", "-c")
_SEARCHPATH_FILE = re.compile(r"file://([^,\]'\"]+)")
_CONF = Path(__file__).resolve().parents[1] / "conf"  # hpctrain's own config groups


def problems(argv: Sequence[str]) -> List[str]:
    """Every problem of the command line and of the YAML files in the config dirs it names."""
    dirs = config_dirs(argv)
    out = [p for d in dirs for p in _dir_problems(d)]
    groups = config_groups([_CONF] + dirs)
    out += [p for line in _overrides(argv) for p in override_problems(line, groups)]
    return out


def config_dirs(argv: Sequence[str]) -> List[Path]:
    """The user's config dirs on this command line (hpctrain's own conf/ is not the user's to check)."""
    out: List[Path] = []
    for flag, value in _flag_values(argv):
        if flag in ("--config-dir", "-cd", "--config-path", "-cp") and not value.startswith("pkg://"):
            out.append(Path(value.removeprefix("file://")))
    for arg in argv:
        if arg.lstrip("+").startswith("hydra.searchpath="):
            out += [Path(m) for m in _SEARCHPATH_FILE.findall(arg)]
    return [d for d in out if d.is_dir()]


def _flag_values(argv: Sequence[str]) -> Iterator[Any]:
    for i, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in _FLAGS_WITH_VALUE:
            if sep:
                yield flag, value
            elif i + 1 < len(argv):
                yield flag, argv[i + 1]


def _overrides(argv: Sequence[str]) -> Iterator[str]:
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE and arg not in ("--info", "--cfg", "-c")
            continue
        yield arg


def _dir_problems(folder: Path) -> List[str]:
    out: List[str] = []
    for i, path in enumerate(sorted(folder.rglob("*.yaml"))):
        if i >= MAX_FILES:
            return out + [f"{folder}: more than {MAX_FILES} YAML files; expected a config dir"]
        problem = yaml_problem(path)
        if problem:
            out.append(problem)
    return out


def yaml_problem(path: Path) -> Optional[str]:
    """One line when ``path`` is not plain YAML of a sane size: not UTF-8, not YAML, a tag that builds an
    object (``!!python/object``), aliases that expand past :data:`MAX_NODES`; None when it is fine."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{path}: not UTF-8 text (byte {exc.start}); expected a YAML config file"
    except OSError as exc:
        return f"{path}: cannot be read ({exc.strerror})"
    try:
        for doc in yaml.compose_all(text, Loader=yaml.SafeLoader):
            if doc is not None:
                _Count(path).node(doc)
    except _Refused as exc:
        return str(exc)
    except yaml.YAMLError as exc:
        return f"{path}: not valid YAML: {' '.join(str(exc).split())}"
    except RecursionError:
        return f"{path}: nested too deep; expected a config file"
    return None


class _Refused(Exception):
    pass


class _Count:
    """The nodes a document expands to, each alias counted as a copy of its anchor (memoized: linear)."""

    def __init__(self, path: Path) -> None:
        self.path, self.sizes, self.open, self.total = path, {}, set(), 0  # type: ignore[var-annotated]

    def node(self, node: yaml.Node) -> int:
        key = id(node)
        if key in self.sizes:
            size: int = self.sizes[key]
        else:
            if key in self.open:
                raise _Refused(f"{self.path}: line {node.start_mark.line + 1}: a recursive alias; expected plain YAML")
            if node.tag not in PLAIN_TAGS:
                raise _Refused(f"{self.path}: line {node.start_mark.line + 1}: tag {node.tag!r} builds an object; "
                               f"expected plain YAML (maps, lists, strings, numbers)")
            self.open.add(key)
            if isinstance(node, yaml.MappingNode):
                size = 1 + sum(self.node(k) + self.node(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self.node(v) for v in node.value)
            else:
                size = 1
            self.open.discard(key)
            self.sizes[key] = size
        if size > MAX_NODES:
            raise _Refused(f"{self.path}: its aliases expand to more than {MAX_NODES} nodes; expected a config file "
                           f"(YAML anchors nested in each other multiply)")
        return size


def config_groups(dirs: Sequence[Path]) -> Dict[str, List[str]]:
    """Config group -> its options, from the config dirs' folders (``model`` -> ``cnn, mlp, ...``)."""
    out: Dict[str, List[str]] = {}
    for folder in dirs:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                options = out.setdefault(entry.name, [])
                options += [p.stem for p in Path(entry.path).glob("*.yaml") if p.stem not in options]
    return out


def override_problems(line: str, groups: Dict[str, List[str]]) -> List[str]:
    """What Hydra would answer with a traceback: a config group given a number or a boolean, a value
    nested deeper than :data:`MAX_DEPTH`. A line Hydra's grammar refuses is left to Hydra (one line)."""
    if line.count("[") + line.count("{") > MAX_DEPTH and _depth_of_text(line) > MAX_DEPTH:
        key = line.partition("=")[0]
        return [f"{key}: its value is nested {_depth_of_text(line)} levels deep; expected at most {MAX_DEPTH}"]
    group = line.partition("=")[0].lstrip("+~").split("@", 1)[0]
    if group not in groups:
        return []  # parsed only for a config group's line: the rest is Hydra's to read
    try:
        o = _parser().parse_override(line)
        values = list(o.sweep_iterator()) if o.is_discrete_sweep() else [o.value()]
    except Exception:  # noqa: BLE001 - Hydra says what its grammar expects, in one line
        return []
    if o.is_delete():
        return []
    bad = [v for v in values if not isinstance(v, str) and not (isinstance(v, list) and all(isinstance(x, str) for x in v))]
    if not bad:
        return []
    options = ", ".join(sorted(groups[group])) or "none found"
    shown = str(bad[0]).lower() if isinstance(bad[0], bool) or bad[0] is None else repr(bad[0])
    return [f"{o.key_or_group}={shown}: expected an option of the config group {group!r} ({options})"]


_PARSER: Any = None


def _parser() -> Any:
    global _PARSER
    if _PARSER is None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        _PARSER = OverridesParser.create()
    return _PARSER


def _depth_of_text(line: str) -> int:
    """How deep brackets nest in an override, quotes left out."""
    depth = most = 0
    quote = ""
    for ch in line:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
            most = max(most, depth)
        elif ch in "]}":
            depth -= 1
    return most
