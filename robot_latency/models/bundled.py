"""Find the shipped planner files: the GGUF models, their manifest, the grammar and the schema.

The files live in the package's ``data/`` directory (installed as package data), so these paths
work from a source checkout and from an installed package alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError

__all__ = [
    "DATA_DIR",
    "MODELS_DIR",
    "BundledModelError",
    "bundled_draft_path",
    "bundled_model_path",
    "grammar_path",
    "load_grammar_text",
    "load_manifest",
    "schema_path",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MODELS_DIR = DATA_DIR / "models"
_FILES = {"planner": "planner.gguf", "planner-draft": "planner-draft.gguf"}


class BundledModelError(RobotLatencyError, FileNotFoundError):
    """A shipped model file or the manifest is missing or unreadable."""


def bundled_model_path(name: str = "planner") -> Path:
    """Return the path of a shipped model.

    Args:
        name: ``"planner"`` (the target) or ``"planner-draft"``.

    Returns:
        The GGUF path.

    Raises:
        BundledModelError: the name is unknown or the file is missing.
    """
    if name not in _FILES:
        raise BundledModelError(f"unknown bundled model {name!r}; known: {sorted(_FILES)}")
    path = MODELS_DIR / _FILES[name]
    if not path.is_file():
        raise BundledModelError(f"bundled model {name!r} missing at {path}")
    return path


def bundled_draft_path() -> Path:
    """Return the path of the shipped draft model (see :func:`bundled_model_path`)."""
    return bundled_model_path("planner-draft")


def load_manifest() -> dict[str, Any]:
    """Read the shipped models' manifest.

    Returns:
        The manifest (files, sha256, shapes, training config, accuracies, prompt format).

    Raises:
        BundledModelError: the manifest is missing or not JSON.
    """
    path = MODELS_DIR / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BundledModelError(f"could not read the model manifest at {path}: {err}") from err


def grammar_path() -> Path:
    """Return the path of the action-token GBNF grammar."""
    return DATA_DIR / "plan_actions.gbnf"


def schema_path() -> Path:
    """Return the path of the expanded plan's JSON Schema."""
    return DATA_DIR / "plan.schema.json"


def load_grammar_text() -> str:
    """Return the action-token GBNF grammar text (for ``llama_cpp.LlamaGrammar.from_string``)."""
    return grammar_path().read_text()
