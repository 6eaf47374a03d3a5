"""Model facts read from GGUF files: shapes from the metadata, bytes from the tensors' types.

Decode at batch 1 reads every weight matrix once per step, except the token-embedding table, which
is a row lookup; a tied output head (the embedding table used as the output projection) is read in
full (docs/REFERENCE.md, "The latency model").
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import struct
from typing import Any

import gguf
from gguf.constants import LlamaFileType

from robot_latency.floor import factstore
from robot_latency.floor.errors import ModelInfoError
from robot_latency.floor.gguf_reader import GGUFReader
from robot_latency.floor.modelfacts import ModelFacts, TensorInfo, _kv_bytes, _kv_ratio

__all__ = ["facts_from_gguf"]

logger = logging.getLogger(__name__)

_GGUF_MAGIC_BYTES = b"GGUF"
_HEADER_BYTES = 24  # magic u32, version u32, tensor_count u64, kv_count u64
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value (u8, empty key)
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (empty name, 0 dims)
_SUPPORTED_VERSIONS = (2, 3)

# Tensors that a decode step reads a row of, not the whole table.
_LOOKUP_TENSORS = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})
_TOKEN_EMBD = "token_embd.weight"
_OUTPUT = "output.weight"

# What the gguf reader raises on malformed input (it slices a memmap and trusts the header).
_READER_ERRORS = (
    ValueError,  # bad magic/version, reshape of short data, unknown type enum, UnicodeDecodeError
    IndexError,  # [0] of an empty slice past the end of the file
    KeyError,  # duplicate keys
    TypeError,
    OverflowError,
    MemoryError,
    struct.error,
    OSError,  # memmap failures
)


def _check_header(path: str) -> int:
    """Check the file exists, is non-empty and starts like a GGUF file; return its size in bytes."""
    if not os.path.exists(path):
        raise ModelInfoError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelInfoError(f"{path}: not a regular file")
    try:
        size_bytes = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(_HEADER_BYTES)
    except OSError as err:
        raise ModelInfoError(f"{path}: cannot read ({err})") from err
    if size_bytes == 0:
        raise ModelInfoError(f"{path}: empty file (0 bytes)")
    magic = head[:4]
    if magic != _GGUF_MAGIC_BYTES:
        raise ModelInfoError(
            f"{path}: not a GGUF file (magic {magic!r}, expected {_GGUF_MAGIC_BYTES!r})"
        )
    if len(head) < _HEADER_BYTES:
        raise ModelInfoError(
            f"{path}: truncated GGUF header ({size_bytes} bytes, the header alone needs "
            f"{_HEADER_BYTES})"
        )
    order = "<"
    (version,) = struct.unpack_from("<I", head, 4)
    if version & 0xFFFF == 0:  # written on a host of the other byte order
        order = ">"
        (version,) = struct.unpack_from(">I", head, 4)
    if version not in _SUPPORTED_VERSIONS:
        raise ModelInfoError(
            f"{path}: GGUF version {version} not supported (readable: {_SUPPORTED_VERSIONS})"
        )
    tensor_count, kv_count = struct.unpack_from(order + "QQ", head, 8)
    min_bytes = _HEADER_BYTES + kv_count * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_INFO_BYTES
    if min_bytes > size_bytes:
        raise ModelInfoError(
            f"{path}: header claims {tensor_count} tensors and {kv_count} metadata keys, more than "
            f"a {size_bytes}-byte file can hold (truncated or corrupt)"
        )
    return size_bytes


def _field_value(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value (scalar, string or list), or None when the key is absent."""
    fld = reader.get_field(key)
    if fld is None:
        return None
    return fld.contents()


def _array_len(reader: gguf.GGUFReader, key: str) -> int | None:
    fld = reader.get_field(key)
    if fld is None or not fld.types or fld.types[0] != gguf.GGUFValueType.ARRAY:
        return None
    return len(fld.data)


def _as_int(path: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelInfoError(
            f"{path}: metadata {key} should be a non-negative integer, got {value!r}"
        )
    return value


def _int_or_list(path: str, key: str, value: Any) -> int | list[int]:
    if isinstance(value, list):
        if not value:
            raise ModelInfoError(f"{path}: metadata {key} is an empty array")
        return [_as_int(path, key, v) for v in value]
    return _as_int(path, key, value)


def _opt_int(path: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    v = _int_or_list(path, key, value)
    return max(v) if isinstance(v, list) else v


def _ftype_name(value: Any) -> str | None:
    """The llama.cpp file type name (``Q4_K_M``) for ``general.file_type``, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        ftype = LlamaFileType(value)
    except ValueError:
        logger.warning("unknown general.file_type %d; using the dominant tensor type", value)
        return None
    if ftype == LlamaFileType.GUESSED:
        return None
    name = ftype.name
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _gguf_version() -> str:
    try:
        return f"gguf {importlib.metadata.version('gguf')}"
    except importlib.metadata.PackageNotFoundError:
        return "gguf, version unknown"


def facts_from_gguf(path: str | os.PathLike[str], *, kv_dtype: str = "f16") -> ModelFacts:
    """Read a model's facts from a GGUF file.

    Shapes come from the ``{arch}.*`` metadata, bytes from the tensors' real types. Raises
    ModelInfoError, naming the file and the problem, for a missing, empty, non-GGUF, truncated or
    otherwise malformed file, or one without the metadata the facts need.
    """
    _kv_ratio(kv_dtype)  # reject a bad cache type before touching the file
    p = os.fspath(path)
    size_bytes = _check_header(p)
    # The reader parses every metadata array (a 150k-token vocabulary: under a second with the
    # project's reader, 12-16 s with gguf's), so a file already read in this process, unchanged
    # since, is not read again, and a file with large metadata is remembered across processes
    # (factstore).
    stat = os.stat(p)
    key = (os.path.realpath(p), stat.st_size, stat.st_mtime_ns, kv_dtype)
    cached = _FACTS_CACHE.get(key)
    if cached is not None:
        return cached
    facts = factstore.recall(p, stat, kv_dtype)
    if facts is None:
        facts, metadata_bytes = _facts_from_file(p, size_bytes, kv_dtype)
        if metadata_bytes >= factstore.REMEMBER_METADATA_BYTES:
            factstore.remember(p, stat, kv_dtype, facts)
    if len(_FACTS_CACHE) >= 64:
        _FACTS_CACHE.clear()
    _FACTS_CACHE[key] = facts
    return facts


_FACTS_CACHE: dict[tuple[str, int, int, str], ModelFacts] = {}


def _facts_from_file(p: str, size_bytes: int, kv_dtype: str) -> tuple[ModelFacts, int]:
    """Read the facts with the project's GGUF reader; return them and the bytes before the data
    (header, metadata and tensor table: what the reader parses)."""
    try:
        reader = GGUFReader(p, "r")
    except _READER_ERRORS as err:
        if isinstance(err, ValueError) and "GGMLQuantizationType" in str(err):
            raise ModelInfoError(
                f"{p}: a tensor has a type this gguf package ({_gguf_version()}) does not know "
                f"({err}); the file may be newer than the package"
            ) from err
        raise ModelInfoError(
            f"{p}: cannot parse GGUF ({type(err).__name__}: {err}); the file ({size_bytes} bytes) "
            f"is truncated or corrupt"
        ) from err
    try:
        return _facts_from_reader(reader, p, size_bytes, kv_dtype), int(reader.data_offset)
    except _READER_ERRORS as err:
        raise ModelInfoError(
            f"{p}: malformed GGUF metadata ({type(err).__name__}: {err})"
        ) from err


def _facts_from_reader(
    reader: gguf.GGUFReader, path: str, size_bytes: int, kv_dtype: str
) -> ModelFacts:
    tensors: list[TensorInfo] = []
    for t in reader.tensors:
        if not t.name:
            raise ModelInfoError(f"{path}: tensor with an empty name (corrupt tensor table)")
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size_bytes:
            raise ModelInfoError(
                f"{path}: tensor {t.name} ends at byte {end}, past the end of the file "
                f"({size_bytes} bytes): truncated"
            )
        tensors.append(
            TensorInfo(
                name=t.name,
                ggml_type=t.tensor_type.name,
                shape=tuple(int(d) for d in t.shape),
                n_elements=int(t.n_elements),
                n_bytes=int(t.n_bytes),
            )
        )
    if not tensors:
        raise ModelInfoError(f"{path}: no tensors (a vocabulary-only file?)")

    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelInfoError(f"{path}: missing metadata general.architecture")

    def key(suffix: str) -> str:
        return f"{arch}.{suffix}"

    def required(suffix: str) -> Any:
        value = _field_value(reader, key(suffix))
        if value is None:
            raise ModelInfoError(f"{path}: missing metadata {key(suffix)}")
        return value

    n_layers = _as_int(path, key("block_count"), required("block_count"))
    hidden = _as_int(path, key("embedding_length"), required("embedding_length"))
    heads_raw = _int_or_list(path, key("attention.head_count"), required("attention.head_count"))
    kv_value = _field_value(reader, key("attention.head_count_kv"))
    # llama.cpp: head_count_kv defaults to head_count when absent
    kv_raw = heads_raw if kv_value is None else _int_or_list(
        path, key("attention.head_count_kv"), kv_value
    )
    n_heads = max(heads_raw) if isinstance(heads_raw, list) else heads_raw
    if n_heads == 0:
        raise ModelInfoError(f"{path}: metadata {key('attention.head_count')} is 0")

    key_len = _opt_int(path, key("attention.key_length"), _field_value(
        reader, key("attention.key_length")))
    head_dim = key_len if key_len is not None else hidden // n_heads
    value_len = _opt_int(path, key("attention.value_length"), _field_value(
        reader, key("attention.value_length")))
    v_dim = value_len if value_len is not None else head_dim

    if isinstance(kv_raw, list):  # per-layer KV head counts (0 for layers without attention)
        kv_heads_sum = sum(kv_raw[:n_layers]) if len(kv_raw) >= n_layers else sum(kv_raw)
        n_kv_heads = max(kv_raw)
    else:
        kv_heads_sum = kv_raw * n_layers
        n_kv_heads = kv_raw
    kv_bytes = _kv_bytes(kv_heads_sum * (head_dim + v_dim), kv_dtype)

    def optional(suffix: str) -> int | None:
        return _opt_int(path, key(suffix), _field_value(reader, key(suffix)))

    ffn = optional("feed_forward_length")
    context = optional("context_length")

    by_name = {t.name: t for t in tensors}
    vocab = _array_len(reader, "tokenizer.ggml.tokens")
    if vocab is None:
        vocab = _opt_int(path, key("vocab_size"), _field_value(reader, key("vocab_size")))
    if vocab is None and _TOKEN_EMBD in by_name and len(by_name[_TOKEN_EMBD].shape) >= 2:
        vocab = by_name[_TOKEN_EMBD].shape[1]

    tied = _OUTPUT not in by_name
    blocks = {int(t.name.split(".")[1]) for t in tensors
              if t.name.startswith("blk.") and t.name.split(".")[1].isdigit()}
    if blocks and max(blocks) >= n_layers:
        raise ModelInfoError(
            f"{path}: tensors for layer {max(blocks)} but {key('block_count')} is {n_layers}"
        )
    if blocks and len(blocks) < n_layers:
        logger.warning("%s: %s is %d but tensors cover %d layers",
                       path, key("block_count"), n_layers, len(blocks))

    tensor_types: dict[str, int] = {}
    matrix_elements: dict[str, int] = {}
    for t in tensors:
        tensor_types[t.ggml_type] = tensor_types.get(t.ggml_type, 0) + t.n_bytes
        if len(t.shape) >= 2:
            matrix_elements[t.ggml_type] = matrix_elements.get(t.ggml_type, 0) + t.n_elements

    total_bytes = sum(t.n_bytes for t in tensors)
    per_step = sum(
        t.n_bytes for t in tensors
        if t.name not in _LOOKUP_TENSORS or (t.name == _TOKEN_EMBD and tied)
    )

    quant = _ftype_name(_field_value(reader, "general.file_type"))
    if quant is None and matrix_elements:
        quant = max(matrix_elements.items(), key=lambda kv: kv[1])[0]

    name = _field_value(reader, "general.name")
    if not isinstance(name, str) or not name:
        name = os.path.splitext(os.path.basename(path))[0]

    facts = ModelFacts(
        name=name,
        source="gguf",
        path=path,
        architecture=arch,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        hidden=hidden,
        ffn=ffn,
        context_length=context,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=sum(t.n_elements for t in tensors),
        weight_bytes_total=total_bytes,
        weight_bytes_per_step=per_step,
        kv_dtype=kv_dtype.strip().lower(),
        kv_bytes_per_token=kv_bytes,
        quant=quant,
        tensor_types=tensor_types,
        tensors=tuple(tensors),
    )
    logger.debug(
        "%s: %s, %d layers, %d params, %d bytes/step, %d KV bytes/token",
        path, arch, n_layers, facts.params, per_step, kv_bytes,
    )
    return facts
