"""Jetson detection, and the sysfs / procfs reading it shares with telemetry.

On a Jetson the module and its nvpmodel power mode are read from the device tree and nvpmodel's
files, because the power mode changes the memory bandwidth. Every read goes through
``read_text`` / ``read_bytes`` under a root directory, so tests run against fixture trees.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from robot_latency.floor.devices import DEVICES
from robot_latency.floor.power_modes import MODES

__all__ = ["JetsonInfo", "detect_jetson", "read_bytes", "read_text", "resolve_under"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class JetsonInfo:
    """What the device tree and nvpmodel say about a Jetson, and the datasheet that fits it."""

    model_string: str
    module: str | None
    power_mode: str | None
    power_mode_id: int | None
    device_id: str | None


# Module part numbers (P-numbers) from NVIDIA's Jetson Linux partition-configuration docs.
# P3701-0000 is the AGX Orin development module (32 GB, but the 64 GB module's 12 CPUs and full
# GPU); JetPack 5 device trees also name it on other AGX Orin devkits, so memory decides there.
_PART_PROFILES: dict[str, tuple[str, ...]] = {
    "p3701-0000": ("orin-agx-32gb", "orin-agx-64gb"),
    "p3701-0004": ("orin-agx-32gb",),
    "p3701-0005": ("orin-agx-64gb",),
    "p3701-0008": ("orin-agx-industrial",),
    "p3767-0000": ("orin-nx-16gb",),
    "p3767-0001": ("orin-nx-8gb",),
    "p3767-0003": ("orin-nano-8gb",),
    "p3767-0004": ("orin-nano-4gb",),
    "p3767-0005": ("orin-nano-8gb",),  # the Orin Nano developer kit's module
    "p3834-0008": ("thor-t5000",),
}
# Module boards, for a part number whose SKU suffix is not in the table above. Where memory
# cannot tell candidates apart, the earlier (lower-bandwidth, so pessimistic) one wins.
_BOARD_PROFILES: dict[str, tuple[str, ...]] = {
    "p3701": ("orin-agx-32gb", "orin-agx-64gb"),
    "p3767": ("orin-nano-4gb", "orin-nano-8gb", "orin-nx-8gb", "orin-nx-16gb"),
    "p3834": ("thor-t5000",),
}
# Model-string keywords, for device trees that carry no module part number.
_MODEL_PROFILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("thor", ("thor-t5000",)),
    ("agx orin", ("orin-agx-32gb", "orin-agx-64gb")),
    ("orin nx", ("orin-nx-8gb", "orin-nx-16gb")),
    ("orin nano", ("orin-nano-4gb", "orin-nano-8gb")),
)
# Power modes that change a module's figures (every nvpmodel mode of robot_latency.floor.power_modes
# has its own datasheet); a mode not in the table maps to the module's base datasheet.
_MODE_DEVICES: dict[str, dict[str, str]] = {}
for _mode in MODES:
    if _mode.device_id != _mode.module:
        _MODE_DEVICES.setdefault(_mode.module, {})[_mode.name] = _mode.device_id

_PART_RE = re.compile(r"\b(p\d{4})-(\d{4})\b")
_PMODE_RE = re.compile(r"\bpmode:(\d+)")
_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\b([^>]*)>")
_MAX_SYMLINKS = 8


def detect_jetson(root: Path = Path("/")) -> JetsonInfo | None:
    """Return the Jetson module and power mode found under `root`, or None on other machines.

    Reads <root>/proc/device-tree/{model,compatible}, <root>/proc/meminfo,
    <root>/var/lib/nvpmodel/status and <root>/etc/nvpmodel.conf. Files that are missing or
    garbled leave the matching fields None rather than failing.
    """
    model = " ".join(_device_tree_strings(root, "model"))
    compatible = _device_tree_strings(root, "compatible")
    is_tegra = any(s.startswith("nvidia,tegra") for s in compatible)
    if not is_tegra and "jetson" not in model.lower():
        return None

    module = _module_part_number(root, compatible)
    power_mode_id, power_mode = _power_mode(root)
    base = _base_device(module, model, _mem_total_bytes(root))
    device_id = None
    if base is not None:
        device_id = _MODE_DEVICES.get(base, {}).get(power_mode or "", base)
    return JetsonInfo(
        model_string=model,
        module=module,
        power_mode=power_mode,
        power_mode_id=power_mode_id,
        device_id=device_id,
    )


def resolve_under(root: Path, relative: str) -> Path:
    """Return root/relative, following a symlink at the end as if `root` were "/".

    /etc/nvpmodel.conf is an absolute symlink to /etc/nvpmodel/nvpmodel_<module>.conf; under a
    fixture root that target must be looked up inside the root, not on this machine.
    """
    path = root / relative
    for _ in range(_MAX_SYMLINKS):
        if not path.is_symlink():
            break
        target = Path(os.readlink(path))
        path = (
            root / target.relative_to(target.anchor)
            if target.is_absolute()
            else path.parent / target
        )
    return path


def read_bytes(root: Path, relative: str) -> bytes | None:
    """Return the file's bytes, or None if it cannot be read."""
    with contextlib.suppress(OSError):
        return resolve_under(root, relative).read_bytes()
    return None


def read_text(root: Path, relative: str) -> str | None:
    """Return the file as text (bad bytes replaced), or None if it cannot be read."""
    data = read_bytes(root, relative)
    return None if data is None else data.decode("utf-8", errors="replace")


def _device_tree_strings(root: Path, prop: str) -> list[str]:
    """Return a device-tree string property as its NUL-separated strings, empties dropped."""
    for base in ("proc/device-tree", "sys/firmware/devicetree/base"):
        data = read_bytes(root, f"{base}/{prop}")
        if data is not None:
            parts = (p.decode("utf-8", errors="replace").strip() for p in data.split(b"\0"))
            return [p for p in parts if p]
    return []


def _module_part_number(root: Path, compatible: list[str]) -> str | None:
    """Return the module's part number ("p3701-0005"), skipping carrier-board numbers."""
    # JetPack 6 lists "nvidia,p3737-0000+p3701-0005" (carrier+module); JetPack 5 device trees
    # may only carry it in nvidia,dtsfilename (".../tegra234-p3701-0000-p3737-0000.dts").
    sources = [*compatible, *_device_tree_strings(root, "nvidia,dtsfilename")]
    for text in sources:
        for board, sku in _PART_RE.findall(text):
            if board in _BOARD_PROFILES:
                return f"{board}-{sku}"
    return None


def _mem_total_bytes(root: Path) -> int | None:
    """Return MemTotal from <root>/proc/meminfo in bytes, or None."""
    text = read_text(root, "proc/meminfo")
    if text is None:
        return None
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _power_mode(root: Path) -> tuple[int | None, str | None]:
    """Return the nvpmodel mode (id, name), or None for what cannot be read.

    nvpmodel keeps the current mode in /var/lib/nvpmodel/status as "pmode:0002" (often with a
    fan-mode field after it) and names modes in /etc/nvpmodel.conf as
    "< POWER_MODEL ID=2 NAME=MAXN_SUPER >". AGX Orin spells modes "MODE_15W"; the prefix is
    dropped so every module reads "15W".
    """
    status = read_text(root, "var/lib/nvpmodel/status")
    match = _PMODE_RE.search(status or "")
    if match is None:
        if status is not None:
            logger.warning("unrecognised nvpmodel status %r under %s", status[:80], root)
        return None, None
    mode_id = int(match.group(1))
    conf = read_text(root, "etc/nvpmodel.conf") or ""
    for block in _POWER_MODEL_RE.finditer(conf):
        attrs = dict(re.findall(r"(\w+)=([^\s>]+)", block.group(1)))
        if attrs.get("ID", "").isdigit() and int(attrs["ID"]) == mode_id and "NAME" in attrs:
            name = attrs["NAME"].upper()
            return mode_id, name.removeprefix("MODE_")
    return mode_id, None


def _base_device(module: str | None, model: str, mem_total_bytes: int | None) -> str | None:
    """Return the module's base (non-mode) datasheet id, or None for an unknown Jetson."""
    if module is not None and module in _PART_PROFILES:
        candidates = _PART_PROFILES[module]
    else:
        by_model = next((ids for key, ids in _MODEL_PROFILES if key in model.lower()), None)
        by_board = _BOARD_PROFILES.get(module.split("-")[0]) if module else None
        if by_board and by_model:
            candidates = tuple(c for c in by_board if c in by_model) or by_board
        else:
            candidates = by_board or by_model or ()
    if not candidates:
        return None
    if mem_total_bytes is None or len(candidates) == 1:
        return candidates[0]
    # MemTotal sits below the module's nominal size (carve-outs), but module sizes step by 2x,
    # so the nearest size on a log scale is unambiguous.
    return min(candidates, key=lambda c: abs(math.log(DEVICES[c].memory_bytes / mem_total_bytes)))
