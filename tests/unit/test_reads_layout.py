"""The read path and import/export hold no SQL: they import neither sqlite3 nor a store
module, their strings hold no SQL statement, and nothing is imported inside a function."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "keymem_daemon" / "engine"
MODULES = sorted([*(ENGINE / "reads").glob("*.py"), ENGINE / "retrieval.py", ENGINE / "transfer.py"])
SQL = re.compile(r"\b(?:SELECT\s.+\sFROM|INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b",
                 re.IGNORECASE | re.DOTALL)

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_read_module_imports_no_storage_and_holds_no_sql(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [m for m in imported if m == "sqlite3" or m.startswith("keymem_daemon.store")]
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert not [s for s in strings if SQL.search(s)]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_read_module_imports_nothing_inside_a_function(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = [f"{fn.name}:{node.lineno}" for fn in ast.walk(tree)
              if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
              for node in ast.walk(fn) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert inside == []
