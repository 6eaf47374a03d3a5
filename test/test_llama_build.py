"""The llama-cpp-python build is one the project makes, per CPU variant, outside pip's cache.

``make`` (dry run, ``-n``) shows the recipe it would run: the portable variant compiles with
``GGML_NATIVE=OFF`` for the x86-64-v3 baseline and no AMX, the native one into a directory of
its own per CPU, neither into pip's shared cache, and every venv installs from that directory.
The version built is the one the requirements pin.
"""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry(*args: str, tmp_path: Path) -> str:
    done = subprocess.run(["make", "-n", "-B", *args, f"LLAMA_WHEELS={tmp_path}/wheels"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 variants")
def test_portable_wheel_recipe(tmp_path: Path) -> None:
    out = _dry("llama-wheel", tmp_path=tmp_path)
    assert "-DGGML_NATIVE=OFF" in out and "-DGGML_AVX2=ON" in out
    assert "-DGGML_AMX_INT8=OFF" in out and "-DGGML_AVX512=OFF" in out
    assert "--no-cache-dir" in out and f"--wheel-dir {tmp_path}/wheels" in out
    pinned = re.search(r"^llama-cpp-python==(\S+)", (ROOT / "requirements/base.txt").read_text(),
                       re.M)
    assert pinned and f"llama-cpp-python=={pinned.group(1)}" in out


def test_native_wheel_is_kept_apart_per_cpu(tmp_path: Path) -> None:
    done = subprocess.run(["make", "-n", "-B", "llama-wheel", "LLAMA_CPU=native"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    assert "-DGGML_NATIVE=ON" in done.stdout
    assert re.search(r"llama-cpp-python-[\d.]+-native-[0-9a-f]{12}", done.stdout)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="a Jetson builds its CUDA wheel itself")
def test_every_venv_installs_the_projects_wheel(tmp_path: Path) -> None:
    for stamp in (".venv/.robot_latency-installed", ".venv-compat/.robot_latency-installed",
                  ".venv-jazzy/.robot_latency-installed"):
        out = _dry(stamp, tmp_path=tmp_path)
        installs = [line for line in out.splitlines() if " install " in line and
                    ("requirements/base.txt" in line or "requirements/compat.txt" in line)]
        assert installs and all(f"--find-links {tmp_path}/wheels" in line for line in installs)
        assert "--force-reinstall" in out and "--no-index" in out
