"""How llama.cpp loads a model here: the extra buffer types off where the build's AMX kernels crash.

llama.cpp's "extra buffer types" are the CPU backend's alternative weight layouts: REPACK (Q4_0,
IQ4_NL and Q8_0 weights interleaved for AVX2/AVX-512/NEON kernels) and, in a build with AMX
kernels, the AMX buffer type. llama-cpp-python 0.3.36 built with ``-march=native`` on a CPU with
AMX compiles those kernels in (its system info: ``AMX_INT8 = 1``), and they segfault in
``decode`` for quantized levels (ggml-org/llama.cpp#20824, ``ggml_backend_amx_mul_mat``, stale
without a fix). Loading with ``llama_model_params.use_extra_bufts = False`` avoids it, at the
cost of the REPACK speed-up (docs/BENCHMARKS.md, "Extra buffer types"). The crash is in the
build's kernels, not the CPU: the portable build (``make install``: x86-64-v3, no AMX kernels)
runs REPACK safely on the same AMX CPU. So the policy keys on the loaded build:

    extra_bufts = "auto"   off where the loaded llama.cpp has AMX kernels, on elsewhere
                  "on"     on (the user says the crash does not apply to their build)
                  "off"    off everywhere

``Llama(...)`` does not expose the field, so :func:`open_llama` sets it on the model parameters
that ``Llama.__init__`` takes from ``llama_model_default_params``, for that one construction and
under a lock. Every ``Llama`` that decodes (the engine, the draft model, the server that
:class:`~robot_latency.engines.llama_server.LocalServer` starts, the benches) goes through it;
one that only tokenizes (``vocab_only``) loads no weights and needs none of this.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError

log = logging.getLogger(__name__)

#: The values of the ``extra_bufts`` option.
EXTRA_BUFTS_CHOICES = ("auto", "on", "off")
#: Where the CPU's flags are read (a test points it at a fixture file).
CPUINFO_PATH = Path("/proc/cpuinfo")
#: The CPU flags that mean AMX (Linux's names).
AMX_FLAGS = frozenset({"amx_int8", "amx_bf16", "amx_tile", "amx_fp16"})
#: The x86 vector extensions worth reporting (Linux's flag names).
_REPORTED_X86 = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                 "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
_REPORTED_ARM = ("asimd", "asimddp", "sve", "sve2", "i8mm", "bf16", "fphp", "asimdhp")

_LOAD_LOCK = threading.Lock()


class LlamaLoadError(RobotLatencyError, ValueError):
    """A bad ``extra_bufts`` value, or a llama-cpp-python whose model params cannot be set."""


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's instruction-set flags as the kernel reports them.

    Args:
        machine: ``platform.machine()`` (x86_64, aarch64, ...).
        flags: every flag of the first processor in /proc/cpuinfo (``flags`` on x86,
            ``Features`` on arm64); empty where the file cannot be read.
        source: the file read, or why none was.
    """

    machine: str
    flags: frozenset[str] = field(default_factory=frozenset)
    source: str = ""

    @property
    def amx(self) -> bool:
        """The CPU has AMX tiles (any of :data:`AMX_FLAGS`)."""
        return bool(self.flags & AMX_FLAGS)

    def reported(self) -> list[str]:
        """The vector extensions worth naming (in a fixed order), those the CPU has."""
        names = _REPORTED_ARM if self.machine in ("aarch64", "arm64") else _REPORTED_X86
        return [name for name in names if name in self.flags]


def read_cpu_features(path: Path | None = None) -> CpuFeatures:
    """Read the CPU's flags from ``path`` (default :data:`CPUINFO_PATH`)."""
    path = CPUINFO_PATH if path is None else path
    machine = platform.machine()
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        return CpuFeatures(machine, frozenset(), f"{path}: {err.strerror or err}")
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return CpuFeatures(machine, frozenset(value.split()), str(path))
    return CpuFeatures(machine, frozenset(), f"{path}: no flags line")


def llama_system_info() -> str:
    """llama.cpp's system info line (``CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | REPACK = 1``)."""
    import llama_cpp

    raw = llama_cpp.llama_print_system_info()
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def build_has_amx(system_info: str) -> bool:
    """The llama.cpp build was compiled with AMX kernels (``AMX_INT8 = 1`` in its system info)."""
    return "AMX_INT8 = 1" in system_info


@dataclass(frozen=True)
class LoadPolicy:
    """The load setting chosen for this CPU and build, and why.

    Args:
        extra_bufts: the option asked for (auto, on, off).
        use_extra_bufts: what ``llama_model_params.use_extra_bufts`` is set to.
        reason: one line for the run's manifest and ``doctor``.
    """

    extra_bufts: str
    use_extra_bufts: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"extra_bufts": self.extra_bufts, "use_extra_bufts": self.use_extra_bufts,
                "reason": self.reason}


def load_policy(extra_bufts: str = "auto", *, features: CpuFeatures | None = None,
                system_info: str | None = None) -> LoadPolicy:
    """Choose ``use_extra_bufts`` for this CPU and llama.cpp build.

    Args:
        extra_bufts: auto, on or off (see the module docstring).
        features: the CPU's flags (default: read now).
        system_info: llama.cpp's system info (default: asked now).

    Raises:
        LlamaLoadError: an ``extra_bufts`` value that is not one of :data:`EXTRA_BUFTS_CHOICES`.
    """
    if extra_bufts not in EXTRA_BUFTS_CHOICES:
        raise LlamaLoadError(f"llamacpp: extra_bufts={extra_bufts!r}: must be one of "
                          f"{EXTRA_BUFTS_CHOICES}")
    if extra_bufts == "on":
        return LoadPolicy("on", True, "extra buffer types on (asked for)")
    if extra_bufts == "off":
        return LoadPolicy("off", False, "extra buffer types off (asked for)")
    features = read_cpu_features() if features is None else features
    info = llama_system_info() if system_info is None else system_info
    cpu = ("the CPU has AMX (" + ", ".join(sorted(features.flags & AMX_FLAGS)) + ")"
           if features.amx else "")
    if build_has_amx(info):
        return LoadPolicy("auto", False, "extra buffer types off: the loaded llama.cpp has AMX "
                          "kernels (AMX_INT8 = 1), whose path segfaults in decode "
                          "(ggml-org/llama.cpp#20824)")
    if cpu:
        return LoadPolicy("auto", True, f"extra buffer types on: {cpu}, but the loaded "
                          "llama.cpp has no AMX kernels (no AMX_INT8 in its system info, as in "
                          "the portable build): REPACK kept")
    return LoadPolicy("auto", True, "extra buffer types on (no AMX: REPACK kept)")


@contextlib.contextmanager
def model_params_set(**fields: Any) -> Iterator[None]:
    """Within the block, ``llama_model_default_params()`` returns params with ``fields`` set.

    ``Llama.__init__`` starts from that function's result and passes it to the model loader;
    this is the one way to reach a field its signature does not expose. Held under a lock, so
    two loads in one process do not see each other's fields.
    """
    import llama_cpp.llama as llama_module

    lib = llama_module.llama_cpp
    with _LOAD_LOCK:
        original = lib.llama_model_default_params

        def patched() -> Any:
            params = original()
            for name, value in fields.items():
                setattr(params, name, value)
            return params

        lib.llama_model_default_params = patched
        try:
            yield
        finally:
            lib.llama_model_default_params = original


def open_llama(policy: LoadPolicy, **kwargs: Any) -> Any:
    """Construct ``llama_cpp.Llama(**kwargs)`` with the extra buffer types as ``policy`` says."""
    import llama_cpp

    with model_params_set(use_extra_bufts=policy.use_extra_bufts):
        llm = llama_cpp.Llama(**kwargs)
    if bool(llm.model_params.use_extra_bufts) != policy.use_extra_bufts:
        raise LlamaLoadError("llamacpp: use_extra_bufts did not reach llama.cpp's model params "
                          "(has llama-cpp-python changed how Llama builds them?)")
    return llm
