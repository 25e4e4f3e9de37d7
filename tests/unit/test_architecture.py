"""The package's shape, checked by reading its source with ``ast`` (nothing is imported).

Four rules (issue 20):

(a) no import cycle among keymem's modules (imports inside function bodies count; those
    under ``if TYPE_CHECKING:`` do not, since they never run);
(b) nothing in ``keymem_daemon/engine/`` imports ``sqlite3`` or a ``keymem_daemon.store``
    module (the engine types against ``engine/ports.py``), not even for type checking;
(c) no module outside ``keymem_daemon/store/`` holds SQL (a string literal that reads as a
    statement; docstrings are prose and do not count);
(d) no module reaches into another module's ``_private`` names: ``x._name`` on anything but
    ``self``, ``cls`` or ``super()`` when ``_name`` is not defined in the same module, and
    ``from m import _name`` of anything that is not a module.

Each rule has an ``ALLOWED_*`` set: today's offenders, while the seams that remove them
land. **A set only ever shrinks**: a new offender fails its rule, and an entry that no
longer offends fails ``..._lists_only_todays_offenders``, so the set is emptied as the work
lands instead of going stale.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT: Final = Path(__file__).resolve().parents[2]
PACKAGES: Final = ("keymem_daemon", "keymem_shim")

# -- the allowed offenders (only ever shrink) ---------------------------------------------

ALLOWED_CYCLES: Final[frozenset[frozenset[str]]] = frozenset()
"""Import cycles, each as the set of modules in it (a strongly connected component)."""

ALLOWED_ENGINE_STORAGE_IMPORTS: Final[frozenset[tuple[str, str]]] = frozenset()
"""``(engine module, what it imports)``: sqlite3 or a store module."""

ALLOWED_SQL_OUTSIDE_STORE: Final[frozenset[str]] = frozenset()
"""Modules outside ``keymem_daemon/store/`` that hold SQL."""

ALLOWED_PRIVATE_REACHES: Final[frozenset[tuple[str, str]]] = frozenset()
"""``(module, private name)``: a module using a ``_name`` another module defines."""


# -- reading the source --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    """Dotted name: ``keymem_daemon.engine.graph``."""
    path: Path
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"

    @property
    def relative(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


@cache
def modules() -> dict[str, Module]:
    """Every module of keymem's packages by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, *, typing_only: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, function bodies included; ``if TYPE_CHECKING:`` blocks
    (not their ``else``) only with ``typing_only``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test) and not typing_only:
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]), typing_only=typing_only)
        else:
            yield from _import_nodes(child, typing_only=typing_only)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_names(module: Module, *, typing_only: bool) -> Iterator[tuple[str, int]]:
    """``(dotted module, line)`` for everything ``module`` imports; ``from m import x`` names
    ``m.x`` when that is a module of ours, else ``m``."""
    ours = modules()
    for node in _import_nodes(module.tree, typing_only=typing_only):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
            continue
        source = _absolute(module, node)
        for alias in node.names:
            candidate = f"{source}.{alias.name}"
            yield (candidate if candidate in ours else source), node.lineno


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports when it runs."""
    ours = modules()
    return {
        name: {target for target, _ in imported_names(module, typing_only=False) if target in ours and target != name}
        for name, module in ours.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def a_cycle_through(graph: dict[str, set[str]], component: frozenset[str]) -> list[str]:
    """One closed import path inside ``component``, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & component):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    return sorted(component)


def engine_storage_imports() -> set[tuple[str, str]]:
    found = set()
    for name, module in modules().items():
        if not name.startswith("keymem_daemon.engine"):
            continue
        for target, _ in imported_names(module, typing_only=True):
            if target == "sqlite3" or target.startswith("sqlite3.") or target.startswith("keymem_daemon.store"):
                found.add((name, target))
    return found


SQL: Final = re.compile(
    r"\b(?:SELECT\b[\s\S]+?\bFROM|INSERT\s+(?:OR\s+[A-Z]+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|CREATE\s+(?:UNIQUE\s+|VIRTUAL\s+)?(?:TABLE|INDEX|TRIGGER|VIEW)|DROP\s+(?:TABLE|INDEX|TRIGGER|VIEW)"
    r"|ALTER\s+TABLE|PRAGMA\s+\w+|BEGIN\s+(?:IMMEDIATE|DEFERRED|EXCLUSIVE)|WITH\s+RECURSIVE)\b"
)
"""A statement as code writes it (upper-case keywords); prose in a string does not read so."""


def _docstrings(tree: ast.Module) -> set[int]:
    """``id()`` of every docstring node (and of attribute docstrings after an assignment)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for position, statement in enumerate(body):
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
                continue
            if isinstance(statement.value.value, str) and (
                position == 0 or isinstance(body[position - 1], (ast.Assign, ast.AnnAssign))
            ):
                found.add(id(statement.value))
    return found


def sql_literals(module: Module) -> list[tuple[int, str]]:
    """``(line, text)`` of each string literal in ``module`` that reads as SQL; an f-string
    is read whole, ``{...}`` for each placeholder (``f"SELECT {columns} FROM memories"``)."""
    skip = _docstrings(module.tree)
    texts: list[tuple[ast.expr, str]] = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values]
            skip.update(id(v) for v in node.values)
            texts.append((node, "".join(str(p) for p in parts)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append((node, node.value))
    return sorted((node.lineno, text) for node, text in texts if id(node) not in skip and SQL.search(text))


def modules_with_sql_outside_store() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for name, module in modules().items():
        if name.startswith("keymem_daemon.store"):
            continue
        hits = sql_literals(module)
        if hits:
            found[name] = hits
    return found


def _defined_privates(tree: ast.Module) -> set[str]:
    """The ``_names`` a module defines itself: functions, classes, assigned names and
    attributes (``self._x = ...``), class fields, parameters and ``__slots__`` entries."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_"):
            found.add(node.value)  # __slots__ = ("_x",), getattr(obj, "_x")
    return {name for name in found if _is_private(name)}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: a class's own attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


@cache
def privates_defined_by_us() -> frozenset[str]:
    """Every ``_name`` some module of ours defines (``os._exit`` is the standard library's)."""
    return frozenset(name for module in modules().values() for name in _defined_privates(module.tree))


def private_reaches(module: Module, *, theirs: frozenset[str] | None = None) -> set[str]:
    """The private names ``module`` uses that another module of ours defines (``theirs``:
    all the private names defined, by default every module's)."""
    own = _defined_privates(module.tree)
    defined = privates_defined_by_us() if theirs is None else theirs
    ours = modules()
    found = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) and not _is_own(node.value):
            if node.attr not in own and node.attr in defined:
                found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                if _is_private(alias.name) and f"{source}.{alias.name}" not in ours:
                    found.add(alias.name)
    return found


def all_private_reaches() -> set[tuple[str, str]]:
    return {(name, private) for name, module in modules().items() for private in private_reaches(module)}


# -- the rules -------------------------------------------------------------------------------


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    new = [c for c in cycles(graph) if c not in ALLOWED_CYCLES]
    assert not new, "import cycles: " + "; ".join(" -> ".join(a_cycle_through(graph, c)) for c in new)


def test_the_engine_imports_neither_sqlite3_nor_a_store_module() -> None:
    new = sorted(engine_storage_imports() - ALLOWED_ENGINE_STORAGE_IMPORTS)
    assert not new, f"the engine imports storage (type against engine/ports.py instead): {new}"


def test_no_module_outside_the_store_holds_sql() -> None:
    found = modules_with_sql_outside_store()
    new = {name: hits[:3] for name, hits in found.items() if name not in ALLOWED_SQL_OUTSIDE_STORE}
    assert not new, f"SQL outside keymem_daemon/store/ (line, text): {new}"


def test_no_module_reaches_into_another_modules_private_names() -> None:
    new = sorted(all_private_reaches() - ALLOWED_PRIVATE_REACHES)
    assert not new, f"(module, private name) used outside the module that defines it: {new}"


def test_each_allowed_set_lists_only_todays_offenders() -> None:
    """An entry that no longer offends must go: the sets only shrink."""
    stale = {
        "ALLOWED_CYCLES": sorted(sorted(c) for c in ALLOWED_CYCLES - set(cycles(import_graph()))),
        "ALLOWED_ENGINE_STORAGE_IMPORTS": sorted(ALLOWED_ENGINE_STORAGE_IMPORTS - engine_storage_imports()),
        "ALLOWED_SQL_OUTSIDE_STORE": sorted(ALLOWED_SQL_OUTSIDE_STORE - set(modules_with_sql_outside_store())),
        "ALLOWED_PRIVATE_REACHES": sorted(ALLOWED_PRIVATE_REACHES - all_private_reaches()),
    }
    stale = {name: entries for name, entries in stale.items() if entries}
    assert not stale, f"remove these entries, they no longer offend: {stale}"


def test_every_package_directory_is_installed() -> None:
    """A package left out of pyproject.toml's list works from a checkout and is missing from
    every installed copy (the plugin's venv, a wheel)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {name for name, module in modules().items() if module.is_package}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


# -- the checks check what they say ------------------------------------------------------------


def _module(name: str, source: str) -> Module:
    return Module(name, ROOT / (name.replace(".", "/") + ".py"), ast.parse(source))


def test_a_cycle_hidden_in_a_function_body_is_found_and_one_under_type_checking_is_not() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert a_cycle_through(graph, frozenset({"a", "b", "c"})) == ["a", "b", "c", "a"]
    hidden = _module("keymem_daemon.x", "def f():\n    from keymem_daemon import runtime\n")
    typing = _module(
        "keymem_daemon.x",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from keymem_daemon import runtime\n",
    )
    assert "keymem_daemon.runtime" in {t for t, _ in imported_names(hidden, typing_only=False)}
    assert "keymem_daemon.runtime" not in {t for t, _ in imported_names(typing, typing_only=False)}
    assert "keymem_daemon.runtime" in {t for t, _ in imported_names(typing, typing_only=True)}


def test_relative_imports_resolve_against_the_module() -> None:
    module = _module("keymem_daemon.engine.graph", "from . import text\nfrom ..store.sqlite import session\n")
    assert {t for t, _ in imported_names(module, typing_only=False)} == {
        "keymem_daemon.engine.text",
        "keymem_daemon.store.sqlite.session",
    }


@pytest.mark.parametrize(
    ("source", "is_sql"),
    [
        ('q = "SELECT id FROM memories WHERE id = ?"', True),
        ('q = f"UPDATE keys SET uses = uses + 1 WHERE id IN ({marks})"', True),
        ('q = f"SELECT {columns} FROM memories"', True),
        ('q = "INSERT OR IGNORE INTO links(a, b) VALUES (?, ?)"', True),
        ('q = "CREATE VIRTUAL TABLE memories_fts USING fts5(content)"', True),
        ('q = "PRAGMA user_version"', True),
        ('def f():\n    """SELECT the best FROM what was found."""', False),
        ('x = "select a memory from the list"', False),
        ('x = "DELETE it"', False),
    ],
)
def test_sql_is_recognised_in_literals_and_not_in_prose(source: str, is_sql: bool) -> None:
    assert bool(sql_literals(_module("keymem_daemon.x", source))) is is_sql


def test_a_private_name_is_a_reach_only_when_another_module_defines_it() -> None:
    source = (
        "from keymem_daemon.engine.graph import _helper\n"
        "class A:\n"
        "    def __init__(self, other):\n"
        "        self._mine = 1\n"
        "        self._theirs = other._concept\n"
        "    def __eq__(self, other):\n"
        "        return other._mine == self._mine and super()._base() and type(self).__name__\n"
    )
    theirs = frozenset({"_helper", "_concept", "_base"})
    assert private_reaches(_module("keymem_daemon.x", source), theirs=theirs) == {"_helper", "_concept"}
    assert private_reaches(_module("keymem_daemon.x", "import os\nos._exit(0)\n"), theirs=theirs) == set()
    assert private_reaches(_module("keymem_shim.__init__", "from keymem_shim import _client\n")) == set()
