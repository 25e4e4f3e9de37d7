"""The read path and import/export import nothing inside a function: their dependencies
are all at the top, where test_architecture's import walk sees them (it checks, for every
module, the storage imports, the SQL and the cycles)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "keymem_daemon" / "engine"
MODULES = sorted([*(ENGINE / "reads").glob("*.py"), ENGINE / "transfer.py"])

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_read_module_imports_nothing_inside_a_function(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = [f"{fn.name}:{node.lineno}" for fn in ast.walk(tree)
              if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
              for node in ast.walk(fn) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert inside == []
