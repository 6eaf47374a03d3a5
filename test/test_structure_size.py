"""No module in robot_latency/ is over 450 lines without a reason written at its top.

A module longer than :data:`MAX_LINES` passes only if its module docstring says why, with the
words "Over 450 lines because" (for a module that would read worse split). Every module is
checked; none is skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "robot_latency"

#: The most lines a module may have without a written reason.
MAX_LINES = 450

#: What the module docstring of a longer module must say.
REASON = "Over 450 lines because"

def too_long(package: Path = PACKAGE) -> dict[str, int]:
    """Return {path under the package: lines} of the modules over the limit without a reason."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
        if REASON not in doc:
            out[path.relative_to(package).as_posix()] = lines
    return out


def test_no_module_over_the_limit_without_a_reason() -> None:
    bad = too_long()
    assert not bad, (
        f"modules over {MAX_LINES} lines: split them by responsibility, or start the module "
        f"docstring with {REASON!r} and the reason:\n"
        + "\n".join(f"  robot_latency/{p}: {n} lines" for p, n in bad.items()))


def test_the_check_counts_lines_and_reads_the_reason(tmp_path: Path) -> None:
    pkg = tmp_path / "robot_latency"
    pkg.mkdir()
    body = "x = 1\n" * MAX_LINES
    (pkg / "short.py").write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    (pkg / "long.py").write_text('"""Long."""\n' + body)
    (pkg / "reasoned.py").write_text(f'"""One table.\n\n{REASON} it is one table."""\n' + body)
    assert too_long(pkg) == {"long.py": MAX_LINES + 1}
