"""The published table's calibrations remembered across processes.

A device's calibration from the published tables (``published_support.table_calibration``)
takes thousands of fits: 5-6 s on a 2-core host, paid by every process that predicts (a planner
node's run as it opens, ``robot-latency predict``). Its answer depends only on what is hashed
into its key, so it is written once to ``<cache root>/calibration/<entry>.json`` (the cache root
of :mod:`robot_latency.digest`) and read back after that. The key holds:

- the content of the published tables the fit reads (decode and prefill: their bytes);
- the code that computes it (every module of :mod:`robot_latency.floor`, their bytes; the
  device datasheets and the flagged sources live there) and :data:`FORMAT`;
- the engine family, the device id and the device's datasheet as given;
- the Python version (the fits use its ``statistics``).

One entry per engine family and device: a key that no longer matches (a table or the code
changed) is stale and replaced. A stale or corrupt entry is set aside with one log line and the
calibration computed again; a cache that cannot be written costs only time. Within a process the
answer is kept in memory too (a managed node computes it at configure, its run reuses it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.digest import cache_root
from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.published_prefill import default_prefill_path, load_prefill_table
from robot_latency.floor.published_support import table_calibration
from robot_latency.floor.published_table import default_table_path, load_table

__all__ = ["FORMAT", "OUTCOMES", "CachedCalibration", "cached_table_calibration",
           "calibration_key", "forget_in_memory", "store_dir"]

log = logging.getLogger(__name__)

#: The entry's format and the key's version: raise it when the answer changes without its
#: inputs changing.
FORMAT = 1

#: Where an answer came from: ``hit`` the cache file; ``miss`` no entry, computed; ``stale`` an
#: entry for other inputs, computed; ``corrupt`` an unreadable entry, computed.
OUTCOMES = ("hit", "miss", "stale", "corrupt")


@dataclass(frozen=True)
class CachedCalibration:
    """A table calibration and how it was had.

    Attributes:
        calibration: the answer (equal to a fresh ``table_calibration``).
        outcome: one of :data:`OUTCOMES`, as this process first had it.
        path: the entry's file.
        written: the entry was written by this process (False: a hit, or it could not be).
        key_digest: the digest of the key (the inputs the answer rests on).
    """

    calibration: Calibration
    outcome: str
    path: Path
    written: bool
    key_digest: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (a cold-start record's ``calibration_cache``)."""
        return {"outcome": self.outcome, "path": str(self.path), "written": self.written,
                "key_digest": self.key_digest}


def store_dir() -> Path:
    """Where remembered calibrations live: ``<cache root>/calibration``."""
    return cache_root() / "calibration"


_CODE: dict[str, str] = {}
_MEMORY: dict[str, CachedCalibration] = {}


def _code_digest() -> str:
    """The digest of the floor package's code (once per process)."""
    if "code" not in _CODE:
        h = hashlib.sha256()
        for path in sorted(Path(__file__).parent.glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        _CODE["code"] = h.hexdigest()
    return _CODE["code"]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def calibration_key(engine_family: str, device: DeviceSheet, *,
                    decode_path: Path | None = None,
                    prefill_path: Path | None = None) -> dict[str, Any]:
    """The inputs ``table_calibration(engine_family, device.id)`` rests on (see the module doc):
    the shipped tables, and the tables fitted in their place where ``decode_path`` or
    ``prefill_path`` is given.

    Raises:
        OSError: a table or a module cannot be read.
    """
    return {"format": FORMAT, "engine_family": engine_family, "device_id": device.id,
            "device": json.loads(json.dumps(dataclasses.asdict(device), default=str)),
            "decode_table": _file_digest(default_table_path()),
            "prefill_table": _file_digest(default_prefill_path()),
            "decode_rows": None if decode_path is None else _file_digest(decode_path),
            "prefill_rows": None if prefill_path is None else _file_digest(prefill_path),
            "code": _code_digest(), "python": list(sys.version_info[:2])}


def _compute(engine_family: str, device_id: str, decode_path: Path | None,
             prefill_path: Path | None) -> Calibration:
    return table_calibration(
        engine_family, device_id,
        rows=None if decode_path is None else load_table(decode_path),
        prefill_rows=None if prefill_path is None else load_prefill_table(prefill_path))


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _entry_path(engine_family: str, device_id: str) -> Path:
    # One entry per family and device: new inputs replace their own entry.
    name = json.dumps([engine_family, device_id])
    return store_dir() / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"


_TUPLES = {f.name for f in dataclasses.fields(Calibration)
           if str(f.type).startswith("tuple")}


def _from_json(doc: Any) -> Calibration:
    if not isinstance(doc, dict):
        raise TypeError(f"a calibration is a mapping, not {type(doc).__name__}")
    fields = {k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in doc.items()}
    cal = Calibration(**fields)
    for f in dataclasses.fields(Calibration):
        value = getattr(cal, f.name)
        if f.name in _TUPLES and value is not None and not isinstance(value, tuple):
            raise TypeError(f"{f.name}: expected a list, got {type(value).__name__}")
    return cal


def _read(path: Path, key: dict[str, Any]) -> tuple[str, Calibration | None]:
    """The entry at ``path``: (``hit``, its calibration), (``miss``|``stale``|``corrupt``,
    None)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no entry, or no store to hold one
        return "miss", None
    except OSError as err:
        log.warning("calibration cache %s unreadable (%s): computing it again", path, err)
        return "corrupt", None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), dict):
            raise ValueError("no key")
        if doc["key"] != key:
            log.info("calibration cache %s is stale (its tables, code or device differ): "
                     "computing it again", path)
            return "stale", None
        return "hit", _from_json(doc["calibration"])
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        log.warning("calibration cache %s is corrupt (%s): computing it again", path, err)
        return "corrupt", None


def _write(path: Path, key: dict[str, Any], cal: Calibration) -> bool:
    doc = {"key": key, "calibration": dataclasses.asdict(cal)}
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
        return True
    except OSError as err:  # a cache that cannot be written costs only time
        log.info("calibration cache %s not written (%s): the next process computes it again",
                 path, err.strerror or err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False


def cached_table_calibration(engine_family: str, device: DeviceSheet, *,
                             decode_path: Path | None = None,
                             prefill_path: Path | None = None) -> CachedCalibration:
    """``table_calibration(engine_family, device.id)`` from the cache, computed and written
    where it holds no entry for these inputs (see the module doc). ``decode_path`` and
    ``prefill_path``: tables fitted in place of the shipped ones (None: the shipped).

    Raises:
        FloorError: as ``table_calibration`` (an answer that cannot be had is never cached).
    """
    try:
        key = calibration_key(engine_family, device, decode_path=decode_path,
                              prefill_path=prefill_path)
    except OSError as err:
        log.info("calibration not cached: its inputs cannot be read (%s)", err)
        return CachedCalibration(
            _compute(engine_family, device.id, decode_path, prefill_path), "miss",
            _entry_path(engine_family, device.id), False, "")
    digest = _digest(key)
    if digest in _MEMORY:
        return _MEMORY[digest]
    path = _entry_path(engine_family, device.id)
    outcome, cal = _read(path, key)
    written = False
    if cal is None:
        cal = _compute(engine_family, device.id, decode_path, prefill_path)
        written = _write(path, key, cal)
    else:
        log.info("target calibration for %s on %s from the cache (%s)", engine_family,
                 device.id, path)
    got = CachedCalibration(cal, outcome, path, written, digest)
    _MEMORY[digest] = got
    return got


def forget_in_memory() -> None:
    """Drop the answers kept in this process (the next call reads the cache file again)."""
    _MEMORY.clear()
