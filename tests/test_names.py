"""One name per concept: no two classes under hpctrain/ share a name (a reader must never ask which ``Run``)."""

import ast
from collections import defaultdict
from pathlib import Path

import hpctrain

ROOT = Path(hpctrain.__file__).parent


def test_no_two_classes_share_a_name():
    where = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    doubled = {name: places for name, places in where.items() if len(places) > 1}
    assert not doubled, doubled
