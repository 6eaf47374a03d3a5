"""The CPU backends of a llama.cpp built with ``GGML_BACKEND_DL``: loaded before any model.

llama.cpp can build every x86-64 CPU variant of its CPU backend into one package
(``-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON``: ``libggml-cpu-haswell.so``,
``libggml-cpu-sapphirerapids.so``, ...) and pick the best one for the CPU at run time, as its
own release binaries do. Such a build registers no backend by itself: llama.cpp's tools call
``ggml_backend_load_all()``, and llama-cpp-python 0.3.36 does not (abetlen/llama-cpp-python#2069:
"no backends are loaded"). :func:`load_cpu_variants` does, once per process, through the same
``libggml.so`` that ``llama_cpp`` loads (one library instance: the registry it fills is the one
llama.cpp reads). ``robot_latency/__init__.py`` calls it, so every entry point (the engine,
tokenizers, ``mtmd``, the benches) finds the backends; with any other build (no variant files
beside ``libggml.so`` or in the wheel's ``bin/``) it does nothing and imports nothing.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_LOADED: list[Path] = []


def llama_lib_dir() -> Path | None:
    """The directory holding llama-cpp-python's shared libraries, without importing it."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib if lib.is_dir() else None


def cpu_variants(lib_dir: Path) -> list[str]:
    """The CPU backend variants a ``GGML_BACKEND_DL`` build put in ``lib_dir`` (names only)."""
    return sorted(p.name for p in lib_dir.glob("libggml-cpu-*.so"))


def variant_dir(lib_dir: Path) -> Path | None:
    """Where the build's CPU variants lie: beside ``libggml.so``, or in the ``bin/`` that
    llama-cpp-python's wheel installs them to (``<site-packages>/bin``); None for other builds."""
    for d in (lib_dir, lib_dir.parent.parent / "bin"):
        if d.is_dir() and cpu_variants(d):
            return d
    return None


def load_cpu_variants(lib_dir: Path | None = None) -> bool:
    """Register the build's CPU backend variants with ggml once; True where there were any.

    A build without variant files (the portable and native wheels) is left alone.
    """
    lib_dir = llama_lib_dir() if lib_dir is None else lib_dir
    variants = None if lib_dir is None else variant_dir(lib_dir)
    if lib_dir is None or variants is None:
        return False
    with _LOCK:
        if lib_dir in _LOADED:
            return True
        ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
        ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_load_all_from_path.restype = None
        ggml.ggml_backend_load_all_from_path(str(variants).encode())
        ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
        n = int(ggml.ggml_backend_reg_count())
        _LOADED.append(lib_dir)
    log.debug("llama.cpp: %d backend(s) registered from %s", n, variants)
    return True
