"""The project's GGUF reader reads every field and tensor exactly as gguf's own reader does."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from robot_latency.floor.gguf_reader import GGUFReader
from robot_latency.models.bundled import bundled_model_path
from robot_latency.profiles.vocab import vocab_path


def _assert_same(path: Path) -> None:
    ours, theirs = GGUFReader(str(path)), gguf.GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for key, a in ours.fields.items():
        b = theirs.fields[key]
        assert (a.offset, a.types, a.data) == (b.offset, b.types, b.data), key
        assert len(a.parts) == len(b.parts), key
        for x, y in zip(a.parts, b.parts, strict=True):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), key
        assert a.contents() == b.contents(), key
    assert ours.data_offset == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors)
    for s, t in zip(ours.tensors, theirs.tensors, strict=True):
        assert (s.name, s.tensor_type, s.n_elements, s.n_bytes, s.data_offset) == (
            t.name, t.tensor_type, t.n_elements, t.n_bytes, t.data_offset)
        assert list(s.shape) == list(t.shape)
        assert np.array_equal(np.asarray(s.data), np.asarray(t.data))


@pytest.mark.parametrize("path", [
    pytest.param(lambda: bundled_model_path("planner"), id="planner"),
    pytest.param(lambda: vocab_path("phi-3"), id="phi-3-vocab"),
])
def test_real_files_read_as_gguf_reads_them(path) -> None:
    _assert_same(Path(path()))


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_array_kind_in_both_byte_orders(tmp_path: Path, endian) -> None:
    out = tmp_path / "arrays.gguf"
    w = gguf.GGUFWriter(str(out), "llama", endianess=endian)
    w.add_array("t.strings", ["", "a", "héllo", "x" * 300])
    w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.text", "plain")
    w.add_uint32("t.u32", 7)
    w.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_same(out)
    assert GGUFReader(str(out)).fields["t.strings"].contents() == ["", "a", "héllo", "x" * 300]


def test_a_file_cut_inside_its_vocabulary_is_one_clear_error(tmp_path: Path) -> None:
    from robot_latency.floor.errors import ModelInfoError
    from robot_latency.floor.modelinfo import facts_from_gguf

    whole = vocab_path("phi-3").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 3])
    with pytest.raises(IndexError):
        gguf.GGUFReader(str(cut))
    with pytest.raises(IndexError):
        GGUFReader(str(cut))
    with pytest.raises(ModelInfoError, match=r"cut\.gguf"):
        facts_from_gguf(cut)
