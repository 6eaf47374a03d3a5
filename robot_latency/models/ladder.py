"""The quantization ladder: one GGUF per llama.cpp quantization preset, built by llama.cpp itself.

``build_ladder`` runs llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``) on a
source GGUF (F32 or F16) once per level and records what came out in a manifest next to the files::

    <cache_dir>/<name>.<QUANT>.gguf      one file per level (F16, Q8_0, ..., Q2_K)
    <cache_dir>/<name>.ladder.json       the manifest (see LadderManifest.to_dict)

A level is rebuilt only when the source changed (its sha256) or its file is missing or has another
size than recorded. The per-tensor types are read back from each file, never assumed from the
preset: K-quants need rows divisible by 256 and llama.cpp falls back to another type (Q5_0, Q8_0,
...) for tensors whose rows are not, which on a small model is most of them.

``ladder_model_path`` is what the CLI's ``--quant`` resolves through: a model name (the bundled
planner, an inflated planner, or a GGUF path) and a level give a file, built on first use into the
default cache directory (``$ROBOT_LATENCY_CACHE_DIR/models``, else
``$XDG_CACHE_HOME/robot_latency/models``, else ``~/.cache/robot_latency/models``).

Levels, the manifest and the cache directory are :mod:`robot_latency.models.ladder_manifest`;
this module builds the levels and resolves a model name to one (and re-exports those names).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from robot_latency.digest import sha256_file
from robot_latency.models.ladder_manifest import (
    LADDER,
    VALID_QUANTS,
    LadderError,
    LadderLevel,
    LadderManifest,
    default_cache_dir,
    level_path,
    llama_cpp_version,
    load_ladder_manifest,
    manifest_path,
    normalize_quant,
)

__all__ = [
    "INFLATED_PREFIX",
    "JSON_INFLATED_PREFIX",
    "LADDER",
    "VALID_QUANTS",
    "LadderError",
    "LadderLevel",
    "LadderManifest",
    "build_ladder",
    "default_cache_dir",
    "ladder_model_path",
    "level_path",
    "load_ladder_manifest",
    "manifest_path",
    "normalize_quant",
    "quantize_gguf",
    "sha256_file",
]

logger = logging.getLogger(__name__)

INFLATED_PREFIX = "planner-inflated-"
#: The JSON planner (Qwen2's tokenizer) inflated into a preset's shape: ``<prefix><preset id>``.
JSON_INFLATED_PREFIX = "planner-json-inflated-"


def inflated_preset(name: str) -> tuple[str, str] | None:
    """Return ``(bundled planner, preset id)`` for an inflated model's name (or a ladder file
    of one, ``planner-json-inflated-qwen2.5-0.5b.Q8_0.gguf``), None for any other name."""
    for prefix, planner in ((JSON_INFLATED_PREFIX, "planner-json"), (INFLATED_PREFIX, "planner")):
        if name.startswith(prefix):
            return planner, name[len(prefix):].split(".gguf")[0]
    return None
"""Model names ``planner-inflated-<preset id>`` name the planner inflated into a preset's shape."""
_LEVEL_SUFFIX = re.compile(r"\.(" + "|".join(re.escape(q) for q in VALID_QUANTS) + r")$", re.I)


def _ftype(quant: str) -> int:
    import llama_cpp

    q = normalize_quant(quant)
    attr = "LLAMA_FTYPE_ALL_F32" if q == "F32" else f"LLAMA_FTYPE_MOSTLY_{q}"
    value = getattr(llama_cpp, attr, None)
    if value is None:
        raise LadderError(f"this llama-cpp-python ({llama_cpp_version()}) has no {attr}")
    return int(value)


def quantize_gguf(src: str | Path, dst: str | Path, quant: str, *, nthread: int = 0) -> Path:
    """Quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``).

    Writes to ``dst + ".tmp"`` first and renames, so a failed or interrupted run leaves no file.

    Args:
        src: the F32/F16 GGUF.
        dst: the output path.
        quant: a level name (``VALID_QUANTS``).
        nthread: quantizer threads (<= 0: llama.cpp uses every core).

    Returns:
        ``dst``.

    Raises:
        LadderError: a bad level name, or llama.cpp failed (its log is on stderr).
    """
    import llama_cpp

    src, dst = Path(src), Path(dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = int(nthread)
    params.ftype = _ftype(quant)
    tmp = dst.with_name(dst.name + ".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise LadderError(f"llama_model_quantize {src} -> {dst} ({quant}) failed with code {rc}")
    os.replace(tmp, dst)
    return dst


def _read_level(path: Path, quant: str, seconds: float, sha: str | None = None) -> LadderLevel:
    """Describe a built file from what it holds."""
    from robot_latency.floor.modelinfo import facts_from_gguf

    prof = facts_from_gguf(path)
    counts: dict[str, int] = {}
    for t in prof.tensors:
        counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
    return LadderLevel(
        quant=quant,
        file=path.name,
        bytes=path.stat().st_size,
        sha256=sha or sha256_file(path),
        effective_bpw=round(prof.effective_bpw, 4),
        tensor_types=counts,
        tensor_type_bytes=dict(prof.tensor_types),
        tensors={t.name: t.ggml_type for t in prof.tensors},
        seconds=round(seconds, 3),
    )


#: Source types a ladder can be quantized from without re-quantizing (which loses precision).
SOURCE_TYPES = ("F32", "F16", "BF16")


def _check_source_precision(src: Path, wanted: Sequence[str]) -> None:
    """Refuse a source already quantized (only the level equal to it could be made honestly)."""
    from robot_latency.floor.errors import ModelInfoError
    from robot_latency.floor.modelinfo import facts_from_gguf

    try:
        ftype = (facts_from_gguf(src).quant or "").upper()
    except ModelInfoError as err:
        raise LadderError(f"ladder source {src}: {err}") from err
    if ftype and ftype not in SOURCE_TYPES and any(q != ftype for q in wanted):
        raise LadderError(f"ladder source {src} is {ftype}; build the levels from an F32, F16 "
                          f"or BF16 GGUF (llama.cpp's convert_hf_to_gguf.py --outtype f16)")


def _default_name(src: Path) -> str:
    """``planner.gguf`` -> ``planner``; ``x.F16.gguf`` -> ``x``."""
    return _LEVEL_SUFFIX.sub("", src.stem)


def build_ladder(
    src_gguf: str | Path,
    cache_dir: str | Path,
    *,
    quants: Iterable[str] = LADDER,
    name: str | None = None,
    nthread: int = 0,
) -> LadderManifest:
    """Quantize a GGUF into every requested level, reusing levels the manifest says are current.

    A level is reused when the manifest's source sha256 equals the source's and the level's file
    is present with the recorded size; otherwise it is (re)built. A changed source invalidates
    every level. Levels built earlier for the same source but not requested now stay in the
    manifest. When a level's path is the source file itself (an inflated ``<name>.F16.gguf``
    quantized from itself), it is recorded without being rebuilt.

    Args:
        src_gguf: the F32/F16 source GGUF.
        cache_dir: where levels and the manifest go (created if missing).
        quants: levels to make (``VALID_QUANTS`` names, any case).
        name: file-name stem; defaults to the source's stem without a ``.<QUANT>`` suffix.
        nthread: quantizer threads (<= 0: every core).

    Returns:
        The manifest (``built`` lists what this call made).

    Raises:
        LadderError: the source is missing, a level name is bad, or llama.cpp failed.
    """
    src = Path(src_gguf)
    if not src.is_file():
        raise LadderError(f"ladder source {src} is not a file")
    wanted = [normalize_quant(q) for q in quants]
    _check_source_precision(src, wanted)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    name = name or _default_name(src)
    src_sha = sha256_file(src)
    old = load_ladder_manifest(cache, name)
    levels: dict[str, LadderLevel] = {}
    if old is not None and old.source_sha256 == src_sha:
        for q, lv in old.levels.items():
            f = cache / lv.file
            if f.is_file() and f.stat().st_size == lv.bytes:
                levels[q] = lv
    elif old is not None:
        logger.info("%s: source %s changed; rebuilding every level", old.manifest_path, src)
    man = LadderManifest(
        name=name,
        cache_dir=cache,
        source=str(src.resolve()),
        source_sha256=src_sha,
        source_bytes=src.stat().st_size,
    )
    for q in wanted:
        if q in levels:
            logger.info("ladder %s: %s is current, skipped", name, q)
            continue
        out = level_path(cache, name, q)
        t0 = time.perf_counter()
        if out.resolve() == src.resolve():
            levels[q] = _read_level(out, q, 0.0, sha=src_sha)
        else:
            quantize_gguf(src, out, q, nthread=nthread)
            levels[q] = _read_level(out, q, time.perf_counter() - t0)
        man.built.append(q)
        logger.info(
            "ladder %s: built %s (%d bytes, %.2f bpw, %.1f s)",
            name, q, levels[q].bytes, levels[q].effective_bpw, levels[q].seconds,
        )
    order = {q: i for i, q in enumerate(VALID_QUANTS)}
    man.levels = {q: levels[q] for q in sorted(levels, key=order.__getitem__)}
    if man.built or old is None or old.to_dict()["levels"] != man.to_dict()["levels"]:
        man.save()
    return man


def ensure_inflated(planner: Path, preset: str, cache: Path, *, name: str | None = None) -> Path:
    """Return the planner inflated into ``preset`` at F16, (re)making it when it is missing or
    was made from another planner file (a sidecar records the source's sha256). ``name``: the
    ladder's name (default ``planner-inflated-<preset>``)."""
    from robot_latency.models.inflate import InflateError, inflate

    src = level_path(cache, name or INFLATED_PREFIX + preset, "F16")
    sidecar = src.with_name(src.name + ".source.json")
    planner_sha = sha256_file(planner)
    if src.is_file() and sidecar.is_file():
        try:
            if json.loads(sidecar.read_text()).get("source_sha256") == planner_sha:
                return src
        except (OSError, ValueError):
            pass  # unreadable sidecar: make the file again
    cache.mkdir(parents=True, exist_ok=True)
    try:
        inflate(planner, preset, src, dtype="F16")
    except InflateError as err:
        raise LadderError(f"cannot inflate {planner} into {preset}: {err}") from err
    sidecar.write_text(json.dumps({"source": str(planner), "source_sha256": planner_sha,
                                   "preset": preset, "dtype": "F16"}, indent=2) + "\n")
    return src


def _resolve_source(model: str | None, cache: Path) -> tuple[Path, str]:
    """Return (source GGUF, ladder name) for a model name, making an inflated source if needed."""
    from robot_latency.models.bundled import BundledModelError, bundled_model_path

    key = (model or "").strip()
    if key in ("", "planner", "planner-draft", "planner-json"):
        try:
            return bundled_model_path(key or "planner"), key or "planner"
        except BundledModelError as err:
            raise LadderError(str(err)) from err
    inflated = inflated_preset(key)
    if inflated is not None:
        from robot_latency.floor.modelinfo import PRESETS

        planner_name, preset = inflated
        if preset not in PRESETS:
            prefix = key[: len(key) - len(preset)]
            valid = ", ".join(prefix + p for p in sorted(PRESETS))
            raise LadderError(f"unknown inflated model {key!r}; valid: {valid}")
        try:
            planner = bundled_model_path(planner_name)
        except BundledModelError as err:
            raise LadderError(str(err)) from err
        return ensure_inflated(planner, preset, cache, name=key), key
    path = Path(key).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path, _default_name(path)
    raise LadderError(
        f"unknown model {model!r}: give 'planner', 'planner-draft', 'planner-json', "
        f"'{INFLATED_PREFIX}<preset>', '{JSON_INFLATED_PREFIX}<preset>' or the path of an "
        f"existing .gguf file"
    )


def ladder_model_path(
    model: str | None, quant: str, *, cache_dir: str | Path | None = None
) -> Path:
    """Return the GGUF of a model at a ladder level, building it on first use.

    Args:
        model: None, ``""`` or ``"planner"`` (the bundled planner), ``"planner-draft"``,
            ``"planner-json"`` (the JSON planner's full-vocabulary GGUF, built on first use),
            ``"planner-inflated-<preset id>"`` (the planner inflated into that preset's shape; the
            F16 inflation is made on first use), ``"planner-json-inflated-<preset id>"`` (the
            JSON planner so inflated), or a GGUF path.
        quant: a level name (``VALID_QUANTS``, any case).
        cache_dir: defaults to :func:`default_cache_dir`.

    Returns:
        The level's file.

    Raises:
        LadderError: a bad quant (the message lists the valid names) or model, or a failed build.
    """
    q = normalize_quant(quant)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    src, name = _resolve_source(model, cache)
    man = build_ladder(src, cache, quants=(q,), name=name)
    return man.path(q)
