"""No import circle between the package's modules, at module level or inside a function.

Walks robot_latency/ with ast and builds the module import graph: an edge for every ``import``
and ``from ... import`` of a robot_latency module, wherever it stands (module level, inside a
function or method, under ``if TYPE_CHECKING``), relative ones resolved; ``from pkg import name``
points at ``pkg.name`` where that is a module, else at ``pkg``. Importing a submodule runs its
package's ``__init__`` first, but that implied edge is not drawn (a package that gathers its
submodules' names would otherwise always close a circle). Any strongly connected set of two or
more modules is a circle, and the test names one, edge by edge, with the file and line of each
import and whether it sits inside a function (the usual way a circle is hidden).
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "robot_latency"

#: (importer, imported) -> (line, inside a function)
Edges = dict[tuple[str, str], tuple[int, bool]]


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, package: Path) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    base = package / rel
    return (base / "__init__.py").is_file() or base.with_suffix(".py").is_file()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool,
             package: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_pkg else 0)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append(sub if _is_module(sub, package) else source)
    return out


def import_graph(package: Path = PACKAGE) -> Edges:
    """Return every edge between robot_latency modules, with where the import stands."""
    root = package.name
    edges: Edges = {}
    for path in sorted(package.rglob("*.py")):
        module = module_name(path, package)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, in_function = stack.pop()
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(child, module, path.name == "__init__.py", package):
                        if (target == root or target.startswith(root + ".")) \
                                and target != module:
                            edges.setdefault((module, target), (child.lineno, inside))
                stack.append((child, inside))
    return edges


def circles(edges: Edges) -> list[list[str]]:
    """Return one circle (a closed path of modules) per strongly connected set of 2+ modules."""
    graph: dict[str, list[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, []).append(dst)
        graph.setdefault(dst, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sets: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                sets.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_path_through(members, graph) for members in sets]


def _path_through(members: list[str], graph: dict[str, list[str]]) -> list[str]:
    """A closed path inside one strongly connected set, from its first member back to it."""
    inside = set(members)
    start = members[0]
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first: the shortest way round
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in inside:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no way round {members}")


def describe(circle: list[str], edges: Edges, package: Path = PACKAGE) -> str:
    lines = [" -> ".join(circle)]
    for src, dst in pairwise(circle):
        line, in_function = edges[(src, dst)]
        where = "inside a function" if in_function else "at module level"
        lines.append(f"    {_file_of(src, package)}:{line} imports {dst} ({where})")
    return "\n".join(lines)


def _file_of(module: str, package: Path) -> str:
    rel = Path(package.name, *module.split(".")[1:])
    init = rel / "__init__.py"
    return str(init if (package.parent / init).is_file() else rel.with_suffix(".py"))


def test_no_import_circle() -> None:
    edges = import_graph()
    found = circles(edges)
    assert not found, "import circles:\n" + "\n".join(describe(c, edges) for c in found)


def test_the_walk_finds_a_circle_hidden_in_a_function(tmp_path: Path) -> None:
    """The checker itself: it sees the package's real edges and a planted function-level circle."""
    edges = import_graph()
    assert ("robot_latency.floor.device_lookup", "robot_latency.floor.jetson") in edges
    assert ("robot_latency.floor.jetson", "robot_latency.floor.devices") in edges
    assert ("robot_latency.floor.devices", "robot_latency.floor.jetson") not in edges

    fake = tmp_path / "robot_latency"
    (fake / "floor").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "floor" / "__init__.py").write_text("")
    (fake / "floor" / "table.py").write_text(
        "def lookup():\n    from .detect import guess\n    return guess()\n")
    (fake / "floor" / "detect.py").write_text(
        "from robot_latency.floor import table\n\ndef guess():\n    return table\n")
    (fake / "floor" / "other.py").write_text("import robot_latency.floor.table\n")
    planted = import_graph(fake)
    found = circles(planted)
    assert len(found) == 1, found
    text = describe(found[0], planted, fake)
    assert "robot_latency.floor.detect -> robot_latency.floor.table -> " \
           "robot_latency.floor.detect" in text, text
    assert "robot_latency/floor/table.py:2 imports robot_latency.floor.detect " \
           "(inside a function)" in text, text
    assert "(at module level)" in text, text
