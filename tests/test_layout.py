"""The package's shape, checked from its source (AST scans of every module under ``pgjobs/``, no database):

* no import cycles among ``pgjobs`` modules, function-local and ``TYPE_CHECKING`` imports included (a package
  ``__init__`` importing its own sub-modules is fine: the scan does not count the implicit import of a parent
  package, only the imports written);
* imports point down: ``pgjobs.client`` never imports ``pgjobs.runtime``, ``cli`` or ``web``; ``pgjobs.runtime``
  never imports ``cli`` or ``web``;
* SQL text only in ``pgjobs/client/`` and ``pgjobs/ops/``: no string constant elsewhere that reads as a SQL
  statement or a call of a ``pgjobs.`` function (docstrings aside);
* no module over 500 lines, no function over 80 lines;
* every repository file a module cites (``pgjobs/...py``, ``tests/...py`` ...) exists;
* no module reaches into another's private names: an attribute ``x._name`` (one leading underscore) is read or
  written only in the module that defines ``_name`` (a ``self._name`` assignment, a class attribute, a
  function or class of that name), so what the worker's parts share is the public, typed interface of
  ``pgjobs.runtime.state.WorkerState``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pgjobs"

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# Exceptions to the size and SQL rules (paths or fnmatch patterns below the repo root): none today. An entry
# must name the issue that removes it; test_the_size_allow_list_names_existing_files keeps each one real.
SIZE_ALLOWED: tuple[str, ...] = ()
SQL_ALLOWED: tuple[str, ...] = ()
# Private names a module may use though another module defines them: (path pattern, name), each with its reason.
# test_the_private_allow_list_is_in_use keeps each entry needed.
PRIVATE_ALLOWED: tuple[tuple[str, str], ...] = (
    # the client's operation classes over their runner base (pgjobs/client/_call.py: SyncRunner, AsyncRunner)
    *(("pgjobs/client/*.py", name) for name in ("_run", "_run_fast", "_fetch", "_pool", "_prepare")),
    # the scheduler and the test kit run calls through a client's runner, which has no public name for it yet
    ("pgjobs/runtime/scheduler.py", "_run"),
    ("pgjobs/testing/__init__.py", "_run"),
    ("pgjobs/testing/__init__.py", "_enqueue_defaults"),
    # the embedded server package's bookkeeping, which it offers no public call to clear
    *(("pgjobs/ops/embedded.py", name) for name in ("_postmaster_info", "_cleanup", "_instances")),
)

# A statement, not a word in a message: the keyword followed by what only SQL puts after it.
_SQL = re.compile(
    r"\bSELECT\s+[\w*(]"
    r"|\bINSERT\s+INTO\b"
    r"|\bUPDATE\s+[\w.]+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\b(?:LISTEN|UNLISTEN|NOTIFY)\s+[\w\"{}]+\s*(?:[,;]|$)"
    r"|\bpgjobs\.[a-z_]+\s*\("
)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The pgjobs modules ``name`` imports, wherever the import statement is (function bodies included)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the sub-module; `from mod import name` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:  # `import pgjobs.x.y` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {name: _imports(name, path, modules) for name, path in sources.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle path (first module repeated at the end) per strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_path_in(graph, component) for component in components]


def _path_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the smallest module of ``component`` (breadth first: a shortest one)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in component {sorted(component)}")


def _in_cli(module: str) -> bool:
    return module == "pgjobs.cli" or module.startswith("pgjobs.cli.")


def _show(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_cycles_outside_the_cli() -> None:
    cycles = [c for c in _cycles(_graph()) if not all(_in_cli(m) for m in c)]
    assert not cycles, "import cycles:\n" + _show(cycles)


def test_no_import_cycles_at_all() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + _show(cycles)


def test_the_cycle_finder_finds_a_cycle_and_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"x": {"y"}, "y": set()}) == []


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("pgjobs.client", ("pgjobs.runtime", "pgjobs.cli", "pgjobs.web")),
        ("pgjobs.runtime", ("pgjobs.cli", "pgjobs.web")),
        ("pgjobs.ops", ("pgjobs.runtime", "pgjobs.cli", "pgjobs.web")),
    ],
)
def test_imports_point_down(layer: str, forbidden: tuple[str, ...]) -> None:
    graph = _graph()
    assert any(m == layer or m.startswith(layer + ".") for m in graph), f"no module in {layer}"
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in graph.items()
        if m == layer or m.startswith(layer + ".")
        for t in targets
        if any(t == f or t.startswith(f + ".") for f in forbidden)
    )
    assert not wrong, "imports pointing up:\n" + "\n".join(wrong)


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def sql_literals(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant in ``source`` that reads as SQL (docstrings aside)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        if is_text and _SQL.search(node.value):
            yield node.lineno, node.value


def test_the_sql_scan_tells_sql_from_prose() -> None:
    sql = [
        '"SELECT id FROM pgjobs.jobs"',
        '"SELECT pgjobs.fail(id => %s)"',
        '"SELECT count(*) FROM t"',
        '"LISTEN pgjobs_schedules"',
        "\"NOTIFY pgjobs_wake, 'q'\"",
        "\"UPDATE pgjobs.jobs SET state = 'failed'\"",
        '"DELETE FROM pgjobs.workers"',
        '"INSERT INTO pgjobs.jobs (kind) VALUES (%s)"',
    ]
    prose = ['"LISTEN connection lost (%s); reconnecting"', '"wakes on NOTIFY at once"', '"select a queue"']
    for text in sql:
        assert list(sql_literals(f"x = {text}\n")), text
    for text in prose:
        assert not list(sql_literals(f"x = {text}\n")), text
    assert not list(sql_literals('"""SELECT * FROM pgjobs.jobs: a docstring may show SQL."""\n'))


def _allowed(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(Path(rel).match(p) for p in patterns)


def _sql_outside_client(allowed: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = _rel(path)
        if rel.startswith(("pgjobs/client/", "pgjobs/ops/")) or _allowed(rel, allowed):
            continue
        found += [f"{rel}:{line}: {text[:80]!r}" for line, text in sql_literals(path.read_text())]
    return found


def test_no_sql_in_the_runtime() -> None:
    found = [f for f in _sql_outside_client(()) if f.startswith("pgjobs/runtime/")]
    assert not found, "SQL text outside pgjobs/client/:\n" + "\n".join(found)


def test_no_sql_outside_client_and_ops() -> None:
    found = _sql_outside_client(SQL_ALLOWED)
    assert not found, "SQL text outside pgjobs/client/ and pgjobs/ops/:\n" + "\n".join(found)


def _long_functions(tree: ast.AST) -> Iterator[tuple[str, int, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield node.name, node.lineno, length


def test_module_and_function_sizes() -> None:
    too_big: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = _rel(path)
        if _allowed(rel, SIZE_ALLOWED):
            continue
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            too_big.append(f"{rel}: {lines} lines (max {MAX_MODULE_LINES})")
        too_big += [
            f"{rel}:{line}: {name}() is {length} lines (max {MAX_FUNCTION_LINES})"
            for name, line, length in _long_functions(ast.parse(source))
        ]
    assert not too_big, "\n".join(too_big)


def test_the_size_allow_list_names_existing_files() -> None:
    for pattern in SIZE_ALLOWED + SQL_ALLOWED:
        assert any(_allowed(_rel(p), (pattern,)) for p in PACKAGE.rglob("*")), f"{pattern} matches nothing"


_CITED = re.compile(r"\b(?:pgjobs|tests|bench|sql|migrations)/[\w/.-]+\.(?:py|sql|plan)\b")


def test_cited_files_exist() -> None:
    """Docstrings and comments name files of the repository: each one is there (no leftover of a move)."""
    missing = [
        f"{_rel(path)}: {cited}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _allowed(_rel(path), SIZE_ALLOWED)
        for cited in _CITED.findall(path.read_text())
        if not (ROOT / cited).exists()
    ]
    assert not missing, "files cited but not in the repository:\n" + "\n".join(missing)


def test_test_files_have_unique_names() -> None:
    """pytest imports test modules by their base name (no __init__.py in tests/sql, tests/runtime, ...): two
    files of one name in different folders make the whole run stop at collection."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not shared, f"test files sharing a name: {shared}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions and classes, names assigned or declared in a class body or
    at module level, and attributes it assigns through ``self`` or ``cls`` (an assignment through any other
    name writes into someone else's object, and defines nothing)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.Module | ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        is_store = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        if is_store and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    return {n for n in names if _is_private(n)}


def private_reaches(source: str) -> list[tuple[int, str]]:
    """(line, ``x._name``) of every private attribute ``source`` uses but does not define."""
    tree = ast.parse(source)
    defined = _defined(tree)
    found = {
        (node.lineno, f"{ast.unparse(node.value)}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr not in defined
    }
    return sorted(found)


def test_the_private_scan_finds_a_reach_into_another_module() -> None:
    source = (
        "class A(Base):\n"
        "    _declared: int\n"
        "    _counter = 0\n"
        "    def __init__(self) -> None:\n"
        "        self._mine = 1\n"
        "    def _helper(self) -> int:\n"
        "        return self._mine + self._declared + self._counter + self.__class__.__hash__()\n"
        "    def uses_the_base(self) -> int:\n"
        "        return self._inherited\n"
        "def f(w: A) -> None:\n"
        "    w._written_here = w._mine + w._helper() + w.public\n"
        "    w._theirs()\n"
    )
    assert private_reaches(source) == [(9, "self._inherited"), (11, "w._written_here"), (12, "w._theirs")]
    assert private_reaches("class B:\n    def __init__(self) -> None:\n        self._x = self.__y\n") == []


def _private_reaches() -> list[tuple[str, str, str]]:
    """(file, name, where) of every private name a module uses and another defines."""
    return [
        (rel, where.rpartition(".")[2], f"{rel}:{line}: {where}")
        for path in sorted(PACKAGE.rglob("*.py"))
        for rel in [_rel(path)]
        for line, where in private_reaches(path.read_text())
    ]


def test_no_module_reaches_into_another_modules_private_names() -> None:
    wrong = [
        where
        for rel, name, where in _private_reaches()
        if not any(Path(rel).match(pattern) and name == allowed for pattern, allowed in PRIVATE_ALLOWED)
    ]
    assert not wrong, "private names used outside the module that defines them:\n" + "\n".join(wrong)


def test_the_private_allow_list_is_in_use() -> None:
    used = {
        (pattern, allowed)
        for rel, name, _ in _private_reaches()
        for pattern, allowed in PRIVATE_ALLOWED
        if Path(rel).match(pattern) and name == allowed
    }
    assert not set(PRIVATE_ALLOWED) - used, f"allowed but no longer used: {sorted(set(PRIVATE_ALLOWED) - used)}"
