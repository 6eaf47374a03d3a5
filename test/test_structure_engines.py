"""No block of six or more lines is pasted between two engine modules (robot_latency/engines/).

Each module is read as a list of code lines: whitespace collapsed, blank lines and comment-only
lines dropped, and the lines of ``import`` statements and of docstrings (module, class and
function) left out, since those repeat by nature. Every window of :data:`WINDOW` consecutive code
lines of one module is compared with every window of each other module; a window found in two
modules fails the test, naming both places. What the engines share belongs in
``engines/base.py`` or ``engines/generate.py``, written once.
"""

from __future__ import annotations

import ast
import re
from itertools import combinations
from pathlib import Path

ENGINES = Path(__file__).resolve().parents[1] / "robot_latency" / "engines"

#: Lines in a window: a run this long in two modules is a pasted block.
WINDOW = 6


def code_lines(source: str) -> list[tuple[int, str]]:
    """Return (line number, normalized text) of the code lines of ``source`` (module docstring)."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    out = []
    for number, line in enumerate(source.splitlines(), start=1):
        text = re.sub(r"\s+", " ", line).strip()
        if number in skip or not text or text.startswith("#"):
            continue
        out.append((number, text))
    return out


def windows(lines: list[tuple[int, str]], size: int = WINDOW) -> dict[tuple[str, ...], int]:
    """Return each run of ``size`` consecutive code lines with the line number it starts at."""
    out: dict[tuple[str, ...], int] = {}
    for i in range(len(lines) - size + 1):
        out.setdefault(tuple(text for _, text in lines[i: i + size]), lines[i][0])
    return out


def duplicated_blocks(paths: list[Path], size: int = WINDOW) -> list[str]:
    """Return ``a.py:L = b.py:M`` for every window of ``size`` lines found in two modules."""
    found = {p: windows(code_lines(p.read_text(encoding="utf-8")), size) for p in paths}
    out = []
    for a, b in combinations(sorted(found), 2):
        for block in found[a].keys() & found[b].keys():
            out.append(f"{a.name}:{found[a][block]} = {b.name}:{found[b][block]}: "
                       + " / ".join(block))
    return sorted(out)


def test_no_block_of_six_lines_is_shared_by_two_engine_modules() -> None:
    paths = sorted(ENGINES.glob("*.py"))
    assert len(paths) >= 5, f"engine modules not found under {ENGINES}"
    dups = duplicated_blocks(paths)
    assert not dups, "blocks pasted between engine modules (share them instead):\n" + \
        "\n".join(dups)


def test_the_check_finds_a_pasted_block(tmp_path: Path) -> None:
    """The detector sees a block pasted into another module, even re-indented, and ignores
    imports and docstrings shared by both."""
    block = ["x = clock()", "token = sample()", "now = clock()", "gaps.append(now - x)",
             "if token == end:", "    return now"]
    shared_head = ['"""Same docstring."""', "import os", "from a import (", "    b,", ")"]
    a = tmp_path / "a.py"
    a.write_text("\n".join([*shared_head, "def f(clock, sample, end, gaps):",
                            *("    " + line for line in block), ""]), encoding="utf-8")
    b = tmp_path / "b.py"
    b.write_text("\n".join([*shared_head, "class C:", "    def g(self, clock, sample, end, gaps):",
                            "        y = 1", *("        " + line for line in block), ""]),
                 encoding="utf-8")
    dups = duplicated_blocks([a, b])
    assert len(dups) == 1 and dups[0].startswith("a.py:7 = b.py:9: x = clock()"), dups
    c = tmp_path / "c.py"
    c.write_text("\n".join([*shared_head, "def h(clock, sample, end, gaps):",
                            *("    " + line for line in [*block[:4], "x2 = 0", *block[4:]]),
                            ""]), encoding="utf-8")
    assert duplicated_blocks([a, c]) == []  # four shared lines, one apart, then two: no block
