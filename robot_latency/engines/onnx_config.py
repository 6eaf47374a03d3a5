"""The ONNX Runtime engine's options and model files: one frozen dataclass, validated in one
place, and where the ``.onnx`` decoder and its tokenizer GGUF come from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from robot_latency.engines.base import EngineError

#: Execution providers asked for by default, in order of preference.
DEFAULT_PROVIDERS: tuple[str, ...] = (
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


@dataclass(frozen=True)
class OnnxConfig:
    """Options of the ONNX Runtime engine; all recorded with every run.

    Args:
        model_path: the ``.onnx`` decoder (FP32 or INT8) from ``export_onnx``/``export_all``;
            a GGUF or "" (the bundled planner): its FP32 export, built into the cache once.
        providers: execution providers to ask for, in order of preference.
        tokenizer_gguf: the GGUF whose vocabulary tokenizes prompts; "" = a GGUF with the same
            stem next to the ``.onnx`` (``planner.int8.onnx`` -> ``planner.gguf``), else the
            bundled planner.
        intra_op_threads: ONNX Runtime threads inside an operator (leave a core to the loop).
        io_binding: keep the KV cache on the provider's device between runs.
        n_ctx: most tokens (prompt + output) per generation.
        chunk_tokens: prefill chunk size: a deadline check runs between chunks.
        prefix_cache: reuse the KV of the prefix shared with the previous prompt.
        seed: sampling seed (only used when a request's temperature > 0).
    """

    model_path: str = ""
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    tokenizer_gguf: str = ""
    intra_op_threads: int = 1
    io_binding: bool = True
    n_ctx: int = 512
    chunk_tokens: int = 64
    prefix_cache: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> EngineError:
            return EngineError(f"onnx: {name}={getattr(self, name)!r}: {why}")

        if isinstance(self.providers, (list, str)):  # from YAML / a CLI flag
            object.__setattr__(self, "providers", tuple(
                [self.providers] if isinstance(self.providers, str) else self.providers))
        if not self.providers or not all(isinstance(p, str) and p for p in self.providers):
            raise bad("providers", "must be a non-empty tuple of provider names")
        if self.intra_op_threads < 1:
            raise bad("intra_op_threads", "must be >= 1")
        if self.n_ctx < 16:
            raise bad("n_ctx", "must be >= 16")
        if self.chunk_tokens < 1:
            raise bad("chunk_tokens", "must be >= 1")


def resolve_onnx_model(model_path: str) -> Path:
    """Return the ``.onnx`` file to load for ``model_path``.

    Args:
        model_path: an ``.onnx`` file; a GGUF (its ONNX export, built into the model cache on
            first use); or "" (the bundled planner's export, likewise).

    Raises:
        EngineError: the GGUF cannot be exported (quantized, unreadable).
    """
    if model_path and not model_path.endswith(".gguf"):
        return Path(model_path)
    from robot_latency.models.onnx_cache import OnnxCacheError, onnx_model_path

    try:
        return onnx_model_path(model_path or None)
    except OnnxCacheError as err:
        raise EngineError(f"onnx: {err}") from err


def resolve_tokenizer_gguf(model_path: Path, tokenizer_gguf: str = "") -> Path:
    """Return the GGUF whose vocabulary tokenizes prompts for ``model_path``.

    Args:
        model_path: the ``.onnx`` file.
        tokenizer_gguf: an explicit GGUF path ("" = look next to the model, then the bundled
            planner).

    Returns:
        The GGUF path.

    Raises:
        EngineError: none found.
    """
    if tokenizer_gguf:
        return Path(tokenizer_gguf)
    stem = model_path.name[: -len(".onnx")] if model_path.name.endswith(".onnx") \
        else model_path.stem
    candidates = [stem]
    for suffix in (".int8", ".fp32", ".fp16"):
        if stem.endswith(suffix):
            candidates.append(stem[: -len(suffix)])
    for cand in candidates:
        path = model_path.with_name(cand + ".gguf")
        if path.is_file():
            return path
    from robot_latency.models.bundled import BundledModelError, bundled_model_path

    try:
        return bundled_model_path()
    except BundledModelError as err:
        raise EngineError(f"onnx: no tokenizer GGUF next to {model_path} "
                          f"({', '.join(c + '.gguf' for c in candidates)}) and {err}") from err
