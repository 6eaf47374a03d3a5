"""Greedy, grammar-constrained plans from a GGUF, and plan accuracy across a quantization ladder.

Kept beside the engines rather than in :mod:`robot_latency.models.ladder`: building a ladder
(quantizing files) needs no engine, while judging its levels decodes with the project's own
llama.cpp engine, so the model-building layer never imports the engine layer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robot_latency.engines.base import GenerationRequest, StopReason, create_engine
from robot_latency.models.ladder import LadderError, LadderManifest
from robot_latency.models.tokenizer import format_prompt
from robot_latency.profiles.actions import actions_gbnf

logger = logging.getLogger(__name__)


def _command_text(cmd: Any) -> str:
    return cmd if isinstance(cmd, str) else str(cmd.text)


def greedy_plans(
    path: str | Path, commands: Sequence[Any], *, max_tokens: int = 24, n_threads: int = 2
) -> list[list[int]]:
    """Decode each command greedily, grammar-constrained, with the project's llama.cpp engine.

    Args:
        path: the GGUF.
        commands: command texts, or objects with a ``text`` attribute (corpus ``Command``).
        max_tokens: most tokens per plan.
        n_threads: llama.cpp threads.

    Returns:
        The output token ids per command (``<end>`` included when it came).

    Raises:
        LadderError: a generation failed.
    """
    grammar = actions_gbnf()
    with create_engine(
        "llamacpp", model_path=str(path), n_threads=n_threads, n_ctx=128, prefix_cache=False,
        abort_callback=False,
    ) as engine:
        out = []
        for cmd in commands:
            text = _command_text(cmd)
            request = GenerationRequest(
                prompt=format_prompt(text), max_tokens=max_tokens, grammar=grammar
            )
            trace = engine.generate(request)
            if trace.stop_reason == StopReason.ERROR:
                raise LadderError(f"{path}: generation failed for {text!r}: {trace.error}")
            out.append(list(trace.tokens))
        return out


def plan_accuracy_by_level(
    manifest: LadderManifest,
    commands: Sequence[Any],
    *,
    reference: str = "F16",
    max_tokens: int = 24,
    n_threads: int = 2,
) -> dict[str, float]:
    """Return, per level, the fraction of commands whose greedy plan equals the reference's.

    Plans are decoded greedily with the action grammar (the engine's grammar-constrained path),
    prompt ``format_prompt(command)``; equality is over the output token ids.

    Args:
        manifest: a built ladder.
        commands: held-out commands (texts, or corpus ``Command`` objects).
        reference: ``"source"`` (the unquantized source file) or a built level's name.
        max_tokens: most tokens per plan.
        n_threads: llama.cpp threads.

    Returns:
        ``{quant: exact-match fraction}`` for every built level (the reference level gives 1.0).

    Raises:
        LadderError: no commands, or the reference level is not built.
    """
    if not commands:
        raise LadderError("plan_accuracy_by_level needs at least one command")
    ref_path = Path(manifest.source) if reference == "source" else manifest.path(reference)
    ref = greedy_plans(ref_path, commands, max_tokens=max_tokens, n_threads=n_threads)
    acc: dict[str, float] = {}
    for q in manifest.levels:
        got = greedy_plans(manifest.path(q), commands, max_tokens=max_tokens, n_threads=n_threads)
        acc[q] = sum(a == b for a, b in zip(ref, got, strict=True)) / len(ref)
        logger.info(
            "ladder %s: %s plan exact-match vs %s %.3f", manifest.name, q, reference, acc[q]
        )
    return acc
