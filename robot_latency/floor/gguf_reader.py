"""gguf's own reader, fast on a real vocabulary's metadata.

``gguf.GGUFReader`` slices its ``np.memmap`` once per array element, and a memmap slice costs
microseconds of Python (``__array_finalize__``): a Qwen2 file's 151,936 tokens and 151,387
merges took 12-16 s to open here, twelve times over when the main job built its levels.
:class:`GGUFReader` is the same reader with the same fields, parts and tensors; it reads through a
plain ``ndarray`` view of the same map and walks string and number arrays in one pass each
(under a second for the same file). ``test/floor/test_gguf_reader.py`` holds every field and
tensor equal to gguf's on a real vocabulary.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Literal

import gguf
import numpy as np

_ARRAY = gguf.GGUFValueType.ARRAY
_STRING = gguf.GGUFValueType.STRING


class GGUFReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` (same constructor, fields and tensors), faster on large arrays."""

    def __init__(self, path: os.PathLike[str] | str,
                 mode: Literal["r", "r+", "c"] = "r") -> None:
        self._plain: np.ndarray[Any, Any] | None = None
        super().__init__(path, mode)

    def _buffer(self) -> np.ndarray[Any, Any]:
        if self._plain is None:
            self._plain = self.data.view(np.ndarray)
        return self._plain

    def _get(self, offset: int, dtype: Any, count: int = 1,
             override_order: Literal["I", "S", "<"] | None = None) -> np.ndarray[Any, Any]:
        count = int(count)
        dt = np.dtype(dtype)
        arr = self._buffer()[offset: offset + dt.itemsize * count].view(dt)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs: int,
                         raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        if gguf.GGUFValueType(raw_type) != _ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n, offs = int(alen[0]), orig_offs + 12
        itype = gguf.GGUFValueType(raw_itype[0])
        parts: list[Any] = [raw_itype, alen]
        if n == 0:
            return offs - orig_offs, parts, [], [_ARRAY]
        if itype == _STRING:
            buf = self._buffer()
            u64 = np.dtype(np.uint64).newbyteorder(self.byte_order)
            fmt = ">Q" if u64.byteorder == ">" else "<Q"
            unpack, view = struct.Struct(fmt).unpack_from, memoryview(buf)
            idxs = []
            for _ in range(n):
                if offs + 8 > len(buf):  # as gguf's reader fails on a truncated file
                    raise IndexError(f"string array past the end of the file at byte {offs}")
                (length,) = unpack(view, offs)
                parts.append(buf[offs: offs + 8].view(u64))
                parts.append(buf[offs + 8: offs + 8 + length])
                idxs.append(len(parts) - 1)
                offs += 8 + length
            return offs - orig_offs, parts, idxs, [_ARRAY, _STRING]
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:  # nested arrays: gguf's own walk
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(offs, nptype, n)
        parts += [values[i: i + 1] for i in range(n)]
        return 12 + int(values.nbytes), parts, list(range(2, 2 + n)), [_ARRAY, itype]
