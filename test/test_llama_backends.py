"""The CPU variants of a GGML_BACKEND_DL build: found where llama-cpp-python's wheel puts them,
and nothing done for any other build (the venv's portable wheel)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp

from robot_latency.llama_backends import (
    cpu_variants,
    llama_lib_dir,
    load_cpu_variants,
    variant_dir,
)
from robot_latency.llama_load import llama_system_info


def test_the_venvs_build_has_no_variants_and_is_left_alone() -> None:
    lib = llama_lib_dir()
    assert lib is not None and lib == Path(llama_cpp.__file__).parent / "lib"
    assert (lib / "libggml.so").is_file()
    assert variant_dir(lib) is None
    assert load_cpu_variants() is False
    # the statically linked CPU backend still answers
    assert "CPU :" in llama_system_info()


def test_variants_are_found_beside_libggml_or_in_the_wheels_bin(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lib = site / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "libggml.so").write_bytes(b"")
    assert variant_dir(lib) is None
    (site / "bin").mkdir()
    for name in ("libggml-cpu-haswell.so", "libggml-cpu-x64.so"):
        (site / "bin" / name).write_bytes(b"")
    assert variant_dir(lib) == site / "bin"
    assert cpu_variants(site / "bin") == ["libggml-cpu-haswell.so", "libggml-cpu-x64.so"]
    (lib / "libggml-cpu-sse42.so").write_bytes(b"")
    assert variant_dir(lib) == lib
