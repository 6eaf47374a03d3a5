"""The two planner nodes stay thin: no block of code is written in both.

planner_node.py and managed_planner_node.py wrap one core (robot_latency/ros/node_core.py);
what both need belongs there. This test compares every window of :data:`WINDOW` consecutive
code lines (whitespace collapsed; blank lines and imports left out) of one node module with the
other's and fails on any window found in both, naming the lines. The topic names are checked
too: written once, in robot_latency/ros/topics.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROS = Path(__file__).resolve().parents[1] / "robot_latency" / "ros"
NODES = (ROS / "planner_node.py", ROS / "managed_planner_node.py")
#: Consecutive normalized lines that make a duplicated block.
WINDOW = 6


def code_lines(text: str) -> list[tuple[int, str]]:
    """Return (line number, line with whitespace collapsed) for each non-blank line.

    Import statements are left out: two modules importing the same names share no code.
    """
    imports = {n for node in ast.walk(ast.parse(text))
               if isinstance(node, (ast.Import, ast.ImportFrom))
               for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        norm = re.sub(r"\s+", " ", line).strip()
        if norm and number not in imports:
            out.append((number, norm))
    return out


def shared_blocks(a: str, b: str, window: int = WINDOW) -> list[tuple[int, int]]:
    """Return (line in a, line in b) where a block of ``window`` lines starts in both texts."""
    la, lb = code_lines(a), code_lines(b)
    starts: dict[tuple[str, ...], int] = {}
    for i in range(len(lb) - window + 1):
        starts.setdefault(tuple(t for _, t in lb[i:i + window]), lb[i][0])
    return [(la[i][0], starts[key]) for i in range(len(la) - window + 1)
            if (key := tuple(t for _, t in la[i:i + window])) in starts]


def test_the_check_finds_a_block_written_twice() -> None:
    block = "\n".join(f"x{i} = {i}  # step {i}" for i in range(WINDOW))
    a = f"import os\n\n{block}\nprint(1)\n"
    b = "def f():\n    pass\n\n" + block.replace(" = ", "   =   ") + "\n"
    assert shared_blocks(a, b) == [(3, 4)]
    shorter = "\n".join(block.splitlines()[:WINDOW - 1])
    assert shared_blocks(f"{shorter}\nother = 1\n", b) == []


def test_no_block_of_six_lines_in_both_node_modules() -> None:
    plain, managed = (p.read_text(encoding="utf-8") for p in NODES)
    shared = shared_blocks(plain, managed)
    assert not shared, (
        f"{len(shared)} blocks of {WINDOW}+ lines are in both {NODES[0].name} and "
        f"{NODES[1].name} (first at lines {shared[0][0]} and {shared[0][1]}): move them to "
        "node_core.py")


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_topic_names_are_written_only_in_topics_py() -> None:
    topics = {"planner/command", "planner/state", "planner/plan", "planner/cycle",
              "planner/latency_probe", "/diagnostics"}
    assert topics <= _string_constants(ROS / "topics.py")
    for path in sorted(ROS.glob("*.py")):
        if path.name != "topics.py":
            assert not topics & _string_constants(path), (
                f"{path.name} writes a topic name; import it from topics.py")
