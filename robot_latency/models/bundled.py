"""Find the shipped planner files: the GGUF models, their manifest, the grammar and the schema.

The files live in the package's ``data/`` directory (installed as package data), so these paths
work from a source checkout and from an installed package alike.

``planner-json`` is the JSON planner (Qwen2's tokenizer, chatml prompt, JSON plan; the
``bundled-json`` profile): the package ships its compact form, and its path is the
full-vocabulary GGUF built from it into the model cache on first use
(:func:`robot_latency.models.json_export.ensure_full`).
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
    "bundled_json_path",
    "bundled_model_path",
    "grammar_path",
    "load_grammar_text",
    "load_json_manifest",
    "load_manifest",
    "schema_path",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MODELS_DIR = DATA_DIR / "models"
_FILES = {"planner": "planner.gguf", "planner-draft": "planner-draft.gguf",
          "planner-json": "planner-json.compact.gguf"}
JSON_MANIFEST = "planner-json.manifest.json"


class BundledModelError(RobotLatencyError, FileNotFoundError):
    """A shipped model file or the manifest is missing or unreadable."""


def bundled_model_path(name: str = "planner") -> Path:
    """Return the path of a shipped model.

    Args:
        name: ``"planner"`` (the target), ``"planner-draft"`` or ``"planner-json"`` (the JSON
            planner, built into the model cache on first use: :func:`bundled_json_path`).

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
    if name == "planner-json":
        return bundled_json_path()
    return path


def bundled_json_path(cache_dir: Path | None = None) -> Path:
    """Return the JSON planner's full-vocabulary GGUF, building it from the shipped compact
    file into the model cache when it is missing or stale.

    Args:
        cache_dir: defaults to the ladder's model cache (``default_cache_dir()``).

    Raises:
        BundledModelError: the compact file or its manifest is missing.
    """
    from robot_latency.models.json_export import ensure_full
    from robot_latency.models.ladder_manifest import default_cache_dir

    compact = MODELS_DIR / _FILES["planner-json"]
    if not compact.is_file():
        raise BundledModelError(f"bundled model 'planner-json' missing at {compact}")
    full = load_json_manifest().get("full", {})
    return ensure_full(compact, cache_dir or default_cache_dir(),
                       expect_sha256=full.get("sha256"))


def load_json_manifest() -> dict[str, Any]:
    """Read the JSON planner's manifest (files, digests, shape, training, figures, prompt).

    Raises:
        BundledModelError: the manifest is missing or not JSON.
    """
    path = MODELS_DIR / JSON_MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BundledModelError(f"could not read the JSON planner's manifest at {path}: "
                                f"{err}") from err


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
