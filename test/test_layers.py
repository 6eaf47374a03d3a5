"""The package's import graph: every import between packages points down the layers.

Walks robot_latency/ with ast (every ``import`` and ``from ... import``, at module level or inside
a function, relative ones resolved) and fails on an import from a unit into a unit above it, or
into a sibling of its own layer. A unit is a subpackage (``planner``) or a top-level module
(``stats``); a new one must be placed in :data:`LAYERS` before it can be imported.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "robot_latency"

#: Top to bottom. A unit may import its own modules and any unit in a lower layer, nothing else.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ros",),                              # the only code that imports rclpy
    ("cli", "cli_*"),                      # the command: parsing, then calls into the core
    ("demo_job", "hostcheck", "launcher"),  # the main job; the machine check (doctor);
                                           # the launch files' nodes without ROS launch
    ("report",),                           # comparisons, plots, tail diagnosis of run directories
    ("planner",),                          # the cycle loop, deadlines, fallbacks, runs
    ("engines", "streams", "telemetry"),   # backends; command sources; host telemetry
    ("models",),                           # tokenizer, corpus, building the demo models
    ("profiles",),                             # planner profiles, prompts, output contracts
    ("stats",),                            # percentiles, Wilson interval, run summary
    ("floor",),                            # predictions and device/model facts
    ("records",),                          # the cycle record (floor calibrates from records)
    ("clock", "digest", "progress", "rosenv", "hostfacts", "llama_load", "lifetime"),
                                           # clock, digest, progress bars, llama.cpp load
                                           # settings, ROS facts, host facts, child processes
                                           # that die with their owner
    ("errors", "__init__"),                # the error base; the package's version
    ("llama_backends",),                   # a DL llama.cpp's CPU variants (stdlib only)
)


def layer_of(unit: str) -> int | None:
    """Return the index of ``unit``'s layer in :data:`LAYERS` (0 = top), None if unplaced."""
    for i, layer in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(unit, pattern) for pattern in layer):
            return i
    return None


def unit_of(module: str) -> str:
    """``robot_latency.planner.loop`` -> ``planner``; ``robot_latency`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """Return (line, imported module) for every robot_latency import in ``path``."""
    module = module_name(path, package)
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            if target == "robot_latency":  # from robot_latency import stats
                out.extend((node.lineno, f"robot_latency.{alias.name}") for alias in node.names
                           if (package / alias.name).is_dir()
                           or (package / f"{alias.name}.py").is_file())
    return [(line, name) for line, name in out
            if name == "robot_latency" or name.startswith("robot_latency.")]


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Return one line per import that breaks the layering (empty when the graph is clean)."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        src = unit_of(module_name(path, package))
        src_layer = layer_of(src)
        where = path.relative_to(package.parent)
        if src_layer is None:
            bad.append(f"{where}: unit {src!r} is in no layer; place it in LAYERS")
            continue
        for line, target in imports(path, package):
            dst = unit_of(target)
            dst_layer = layer_of(dst)
            if dst == src:
                continue
            if dst_layer is None:
                bad.append(f"{where}:{line}: imports {target}, whose unit {dst!r} is in no layer")
            elif dst_layer <= src_layer:
                how = "up" if dst_layer < src_layer else "sideways"
                bad.append(f"{where}:{line}: {src} imports {target} ({how}: {dst!r} is not below "
                           f"{src!r})")
    return bad


def test_every_import_points_down() -> None:
    bad = upward_imports()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_walk_sees_imports(tmp_path: Path) -> None:
    """The checker itself: it finds the package's real edges and flags a planted upward one."""
    edges = {(unit_of(module_name(p)), unit_of(t)) for p in PACKAGE.rglob("*.py")
             for _, t in imports(p)}
    assert ("planner", "engines") in edges and ("report", "stats") in edges
    assert ("engines", "planner") not in edges and ("models", "engines") not in edges
    # The statistics live below the planner: it no longer reaches up into report for them.
    assert ("planner", "report") not in edges and ("planner", "stats") in edges

    fake = tmp_path / "robot_latency"
    (fake / "engines").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engines" / "__init__.py").write_text("")
    (fake / "engines" / "x.py").write_text(
        "def f():\n    from ..planner import rules\n    import robot_latency.floor.predict\n")
    bad = upward_imports(fake)
    assert len(bad) == 1 and "engines imports robot_latency.planner" in bad[0], bad
    assert "robot_latency/engines/x.py:2" in bad[0]
