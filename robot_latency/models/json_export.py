"""The JSON planner's files: a compact GGUF in the repository, the full-vocabulary GGUF built
from it on first use.

Qwen2's vocabulary has 151,936 ids; the planner uses about a thousand. A full-vocabulary GGUF at
the trained width is two 151,936-row matrices (token embedding and output; ~78 MB each in F16, 41
MB in Q8_0), almost all rows copies of one vector or zeros. The repository ships the compact model
(``planner-json.compact.gguf``: its rows only, the map of their real ids in the key
``robot_latency.token_ids``, no tokenizer), and :func:`build_full` writes the file llama.cpp
loads, deterministically, into the model cache (:func:`ensure_full`; the manifest records both
digests):

* ``token_embd``: mapped id ``ids[i]`` gets compact row ``i``; every other id the ``UNK`` row
  (the input an id unseen in training reads as, see :mod:`robot_latency.models.json_train`);
* ``output``: mapped ids their rows, every other id a zero row, so its logit is 0: the softmax
  is the one trained, where the ``UNK`` column held ``log(n_unmapped)`` for all of them;
* the tokenizer: every ``tokenizer.*`` key of the shipped Qwen2 vocabulary-only GGUF (tokens,
  merges, token types, pre-tokenizer ``qwen2``, special ids, chat template), copied as they are.

Architecture ``llama`` (the trained decoder is llama's; Qwen2's q/k/v biases are not used).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.digest import sha256_file
from robot_latency.models.export import (
    ExportError,
    GGUFShape,
    gguf_tensor_names,
    write_llama_hparams,
)
from robot_latency.models.tokenizer import copy_tokenizer_metadata

__all__ = ["COMPACT_FILE", "FULL_NAME", "build_full", "ensure_full", "read_compact",
           "write_compact"]

logger = logging.getLogger(__name__)

COMPACT_FILE = "planner-json.compact.gguf"
#: The full file's context length. The model trained on rows of up to 1,024 tokens (the
#: 512-token system prompt, command and plan); the engine checks at load that the prefix, the
#: longest command the loop accepts (``max_command_chars``, counted as characters, an upper
#: bound on tokens) and ``max_tokens`` fit, which takes 1,274. Positions past the trained ones
#: are reached only by a command of several hundred characters.
FULL_CONTEXT = 2048
#: The full-vocabulary file's name in the model cache (``<name>.F16.gguf``, a ladder source).
FULL_NAME = "planner-json"
_IDS_KEY = "robot_latency.token_ids"
_NVOCAB_KEY = "robot_latency.full_vocab_size"
_FAMILY_KEY = "robot_latency.tokenizer_family"


def write_compact(path: Path, shape: GGUFShape, tensors: Mapping[str, np.ndarray],
                  tmap: Any, *, family: str = "qwen2") -> Path:
    """Write the compact model: F16 matrices, F32 norms, the id map; no tokenizer.

    Args:
        path: output file.
        shape: the compact shape (``vocab_size`` = mapped ids + ``UNK``).
        tensors: ``{gguf_name: array}``.
        tmap: the :class:`robot_latency.models.json_train.TokenMap`.
        family: the tokenizer family the ids belong to.
    """
    import gguf

    if shape.vocab_size != tmap.size:
        raise ExportError(f"{path}: shape has {shape.vocab_size} rows, the map {tmap.size}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("robot_latency JSON planner (compact)")
    write_llama_hparams(writer, shape)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_array(_IDS_KEY, [int(t) for t in tmap.ids])
    writer.add_uint32(_NVOCAB_KEY, int(tmap.n_vocab))
    writer.add_string(_FAMILY_KEY, family)
    for name, want in gguf_tensor_names(shape).items():
        arr = np.ascontiguousarray(np.asarray(tensors[name], dtype=np.float32))
        if arr.shape != want:
            raise ExportError(f"{path}: {name} has shape {arr.shape}, expected {want}")
        writer.add_tensor(name, arr.astype(np.float16) if arr.ndim > 1 else arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_compact(path: Path) -> tuple[GGUFShape, dict[str, np.ndarray], list[int], int, str]:
    """Read a compact model: shape, tensors (F32 or F16 as stored), mapped ids, full vocabulary
    size and tokenizer family.

    Raises:
        ExportError: the file is not a compact planner.
    """
    from robot_latency.floor.gguf_reader import GGUFReader

    reader = GGUFReader(str(path))
    f = reader.fields

    def scalar(key: str) -> Any:
        if key not in f:
            raise ExportError(f"{path}: no {key}; not a compact JSON planner")
        return f[key].contents()

    ids = [int(t) for t in scalar(_IDS_KEY)]
    shape = GGUFShape(
        vocab_size=len(ids) + 1, dim=int(scalar("llama.embedding_length")),
        n_layers=int(scalar("llama.block_count")),
        n_heads=int(scalar("llama.attention.head_count")),
        n_kv_heads=int(scalar("llama.attention.head_count_kv")),
        ffn_dim=int(scalar("llama.feed_forward_length")),
        context_length=int(scalar("llama.context_length")),
        rope_base=float(scalar("llama.rope.freq_base")),
        norm_eps=float(scalar("llama.attention.layer_norm_rms_epsilon")))
    tensors = {t.name: np.array(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))
               for t in reader.tensors}
    return shape, tensors, ids, int(scalar(_NVOCAB_KEY)), str(scalar(_FAMILY_KEY))


def build_full(compact: Path, out: Path, *, vocab_gguf: Path | None = None) -> Path:
    """Write the full-vocabulary GGUF llama.cpp loads (see the module docstring).

    Args:
        compact: the compact model.
        out: the GGUF to write.
        vocab_gguf: the tokenizer's vocabulary-only GGUF (default: the shipped one of the
            compact model's family).

    Returns:
        ``out``.

    Raises:
        ExportError: the vocabulary's size is not the one the model was trained against.
    """
    import gguf

    from robot_latency.profiles.vocab import vocab_path

    shape, tensors, ids, n_vocab, family = read_compact(compact)
    vocab_gguf = vocab_gguf or vocab_path(family)
    full = GGUFShape(**{**shape.__dict__, "vocab_size": n_vocab,
                        "context_length": max(shape.context_length, FULL_CONTEXT)})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("robot_latency JSON planner")
    write_llama_hparams(writer, full)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    n_tokens = copy_tokenizer_metadata(writer, vocab_gguf)
    if n_tokens != n_vocab:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise ExportError(f"{vocab_gguf} has {n_tokens} tokens; {compact} was trained for "
                          f"{n_vocab}")
    rows = np.asarray(ids, dtype=np.int64)
    for name in gguf_tensor_names(full):
        arr = tensors[name]
        if name == "token_embd.weight":
            big = np.repeat(arr[len(ids):len(ids) + 1].astype(np.float16), n_vocab, axis=0)
            big[rows] = arr[: len(ids)].astype(np.float16)
            arr = big
        elif name == "output.weight":
            big = np.zeros((n_vocab, shape.dim), dtype=np.float16)
            big[rows] = arr[: len(ids)].astype(np.float16)
            arr = big
        elif arr.ndim > 1:
            arr = arr.astype(np.float16)
        writer.add_tensor(name, np.ascontiguousarray(arr))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    logger.info("wrote %s (%d bytes)", out, out.stat().st_size)
    return out


def ensure_full(compact: Path, cache_dir: Path, *, expect_sha256: str | None = None) -> Path:
    """Return the full-vocabulary GGUF in ``cache_dir``, building it when it is missing or was
    built from another compact file or at another context length (a sidecar records both).

    Args:
        compact: the shipped compact model.
        cache_dir: the model cache.
        expect_sha256: the digest the manifest records for the full file; a build that differs
            (another ``gguf`` version laying the file out differently) is logged.
    """
    out = cache_dir / f"{FULL_NAME}.F16.gguf"
    sidecar = out.with_name(out.name + ".source.json")
    source_sha = sha256_file(compact)
    if out.is_file() and sidecar.is_file():
        try:
            made = json.loads(sidecar.read_text())
            if (made.get("source_sha256") == source_sha
                    and made.get("context_length") == FULL_CONTEXT):
                return out
        except (OSError, ValueError):
            pass  # unreadable sidecar: build again
    build_full(compact, out)
    sha = sha256_file(out)
    if expect_sha256 and sha != expect_sha256:
        logger.warning("%s: sha256 %s, the manifest records %s (same weights, another layout?)",
                       out, sha, expect_sha256)
    sidecar.write_text(json.dumps({"source": str(compact), "source_sha256": source_sha,
                                   "context_length": FULL_CONTEXT, "sha256": sha},
                                  indent=2) + "\n")
    return out
