"""ONNX exports of GGUF models in the model cache, built on first use (as the quant ladder is).

Layout, under the model cache (:func:`robot_latency.models.ladder.default_cache_dir`)::

    onnx/<stem>-<sha256[:16] of the GGUF>/<stem>.onnx        FP32 decoder (what the engine loads)
                                         /<stem>.int8.onnx   dynamic INT8 copy
                                         /<stem>.onnx.json   manifest (sizes, sha256, source)
                                         /<stem>.gguf        link to the source: the tokenizer
    onnx/<stem>-<sha256[:16] of the mmproj>/<stem>.onnx      a vision tower and its projector
                                           /<stem>.onnx.json manifest (size, sha256, source)

A directory named by the source's digest is complete or absent: it is built beside its final name
and renamed into place, so an interrupted export or two processes exporting at once never leave a
half-written model that a later run would load.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from robot_latency.models.ladder import default_cache_dir, sha256_file
from robot_latency.models.onnx_export import OnnxExportError, export_all

__all__ = ["OnnxCacheError", "OnnxExport", "ensure_onnx_export", "ensure_vision_onnx",
           "onnx_model_path"]

log = logging.getLogger(__name__)

WEIGHTS = ("fp32", "int8")


class OnnxCacheError(OnnxExportError):
    """A GGUF's ONNX export cannot be found or built (unreadable, quantized, cache not writable)."""


@dataclass(frozen=True)
class OnnxExport:
    """One GGUF's exports in the cache.

    Attributes:
        source: the GGUF exported.
        directory: the cache directory holding the files.
        fp32: the FP32 ``.onnx``.
        int8: the dynamic INT8 ``.onnx``.
        built: True when this call exported it, False when it was already in the cache.
    """

    source: Path
    directory: Path
    fp32: Path
    int8: Path
    built: bool

    def path(self, weights: str = "fp32") -> Path:
        """Return the file of ``weights`` ("fp32" or "int8")."""
        if weights not in WEIGHTS:
            raise OnnxCacheError(f"weights={weights!r}: must be one of {WEIGHTS}")
        return self.fp32 if weights == "fp32" else self.int8


def _complete(directory: Path, stem: str) -> bool:
    """True when the manifest is there and every file it lists has its recorded size."""
    try:
        manifest = json.loads((directory / f"{stem}.onnx.json").read_text())
        files = manifest["files"].values()
        return all((directory / f["path"]).stat().st_size == f["bytes"] for f in files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _build_in_place(source: Path, final: Path, cache: Path,
                    write: Callable[[Path], None]) -> None:
    """Run ``write`` into a fresh directory beside ``final``, then rename it to ``final``."""
    stem = source.stem
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=final.parent))
    except OSError as err:
        raise OnnxCacheError(f"model cache {cache} is not writable: {err}; set "
                             f"ROBOT_LATENCY_CACHE_DIR to a writable directory") from err
    try:
        log.info("exporting %s to ONNX in %s", source, final)
        write(work)
        if final.exists():
            shutil.rmtree(final)  # incomplete or rebuild: replaced, never loaded half-written
        try:
            os.replace(work, final)
        except OSError:
            if not _complete(final, stem):  # not another process's finished export
                raise
    except OSError as err:
        raise OnnxCacheError(f"cannot write the ONNX export of {source} to {final}: {err}") \
            from err
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_onnx_export(gguf: str | os.PathLike[str] | None = None, *,
                       cache_dir: str | os.PathLike[str] | None = None,
                       rebuild: bool = False) -> OnnxExport:
    """Return the ONNX exports of a GGUF, exporting it into the cache if they are not there.

    Args:
        gguf: an F32/F16 llama GGUF; None: the bundled planner.
        cache_dir: the model cache (default: :func:`default_cache_dir`).
        rebuild: export again even when a complete export is cached.

    Returns:
        The export's files.

    Raises:
        OnnxCacheError: the GGUF is missing, cannot be exported, or the cache is not writable.
    """
    if gguf is None:
        from robot_latency.models.bundled import bundled_model_path

        source = bundled_model_path("planner")
    else:
        source = Path(gguf).expanduser()
    if not source.is_file():
        raise OnnxCacheError(f"{source}: no such GGUF file")
    source = source.resolve()
    stem = source.stem
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / "onnx" / f"{stem}-{sha256_file(source)[:16]}"
    export = OnnxExport(source, final, final / f"{stem}.onnx", final / f"{stem}.int8.onnx",
                        built=False)
    if not rebuild and _complete(final, stem):
        return export

    def write(work: Path) -> None:
        try:
            export_all(source, work, name=stem)
        except OnnxExportError as err:
            raise OnnxCacheError(f"cannot export {source} to ONNX: {err}") from err
        # The engine tokenizes with the GGUF of the same stem next to the .onnx.
        (work / f"{stem}.gguf").symlink_to(source)

    _build_in_place(source, final, cache, write)
    return OnnxExport(source, final, export.fp32, export.int8, built=True)


def onnx_model_path(gguf: str | os.PathLike[str] | None = None, *, weights: str = "fp32",
                    cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the ``.onnx`` of a GGUF (None: the bundled planner), exported on first use."""
    return ensure_onnx_export(gguf, cache_dir=cache_dir).path(weights)


def ensure_vision_onnx(mmproj: str | os.PathLike[str], *,
                       cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the ONNX export of an mmproj's vision tower, exporting it into the cache on first
    use (:func:`robot_latency.models.vision_onnx.export_vision_onnx`).

    Raises:
        OnnxCacheError: the mmproj is missing or cannot be exported, or the cache is not
            writable.
    """
    from robot_latency.models.mmproj import MmprojError
    from robot_latency.models.vision_onnx import export_vision_onnx

    source = Path(mmproj).expanduser()
    if not source.is_file():
        raise OnnxCacheError(f"{source}: no such mmproj file")
    source = source.resolve()
    stem = source.stem
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = sha256_file(source)
    final = cache / "onnx" / f"{stem}-{digest[:16]}"
    if _complete(final, stem):
        return final / f"{stem}.onnx"

    def write(work: Path) -> None:
        try:
            out = export_vision_onnx(source, work / f"{stem}.onnx")
        except MmprojError as err:
            raise OnnxCacheError(f"cannot export {source} to ONNX: {err}") from err
        entry = {"path": out.name, "bytes": out.stat().st_size, "sha256": sha256_file(out)}
        manifest = {"source": {"path": str(source), "sha256": digest}, "kind": "vision",
                    "files": {"vision": entry}}
        (work / f"{stem}.onnx.json").write_text(json.dumps(manifest, indent=2) + "\n")

    _build_in_place(source, final, cache, write)
    return final / f"{stem}.onnx"
