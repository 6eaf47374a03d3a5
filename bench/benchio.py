"""The bench scripts' common output: one JSON object on stdout, and in ``--out`` when given."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def emit_result(result: dict[str, Any], out: Path | None) -> int:
    """Print ``result`` as JSON, led by the command that produced it; write it to ``out`` too.

    Returns the exit status (0), for ``return emit_result(...)`` at the end of ``main``.
    """
    doc = {"command": "python " + " ".join(sys.argv), **result}
    text = json.dumps(doc, indent=2)
    sys.stdout.write(text + "\n")
    if out is not None:
        Path(out).write_text(text + "\n")
    return 0
