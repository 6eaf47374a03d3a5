"""Which ONNX Runtime execution providers can initialise on this machine, found without trying.

onnxruntime-gpu lists the TensorRT and CUDA providers as available on every machine; creating a
session with them where there is no GPU (or no TensorRT) prints an "EP Error" block to stdout and
retries on the next provider. Here a GPU provider is kept only when the CUDA driver reports a
device and the provider's own library loads (its CUDA, cuDNN or TensorRT dependencies resolve),
so the session is asked only for providers that can start.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

#: The provider library each GPU provider loads, in onnxruntime/capi.
_PROVIDER_LIBRARIES = {
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
}
#: The CUDA driver library (the Jetson's comes with L4T, a desktop's with the NVIDIA driver).
_CUDA_DRIVER = ("libcuda.so.1", "libcuda.so")


@dataclass(frozen=True)
class ProviderChoice:
    """The providers to ask a session for, and why the others were left out.

    Attributes:
        usable: the requested providers that can initialise here, in the requested order.
        dropped: provider name -> the reason it was left out.
    """

    usable: tuple[str, ...]
    dropped: dict[str, str] = field(default_factory=dict)


@lru_cache(maxsize=1)
def cuda_device_count() -> tuple[int, str]:
    """Return (CUDA devices the driver reports, a note); (0, why) without driver or device."""
    for name in _CUDA_DRIVER:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    if lib.cuInit(0) != 0:
        return 0, "the CUDA driver found no usable device (cuInit failed)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0, "cuDeviceGetCount failed"
    return count.value, f"{count.value} CUDA device(s)"


@cache
def _library_loads(path: str) -> str | None:
    """Return None when the shared library at ``path`` loads, else the loader's message."""
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as err:
        return str(err)
    return None


def choose_providers(requested: Sequence[str]) -> ProviderChoice:
    """Keep the requested providers that this onnxruntime offers and that can initialise here.

    Args:
        requested: provider names in order of preference.

    Returns:
        The usable ones (order kept) and a reason for each one dropped.
    """
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    capi = Path(ort.__file__).parent / "capi"
    usable: list[str] = []
    dropped: dict[str, str] = {}
    for name in requested:
        if name not in available:
            dropped[name] = "not in this onnxruntime build"
            continue
        library = _PROVIDER_LIBRARIES.get(name)
        if library is not None:
            devices, note = cuda_device_count()
            if devices == 0:
                dropped[name] = note
                continue
            error = _library_loads(str(capi / library))
            if error is not None:
                dropped[name] = f"its library does not load: {error}"
                continue
        usable.append(name)
    return ProviderChoice(tuple(usable), dropped)
