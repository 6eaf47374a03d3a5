"""The shipped table of published batch-1 decode rates: its rows, the loader and per-row lookups.

``robot_latency/data/published_decode.yaml`` holds one row per published figure (module, power
mode, model, quant, engine and version, tok/s, lengths, source address). This module reads and
checks it (:func:`load_table`), says which rows are not predicted and why, and turns a row into
the bytes its model reads and a :class:`~robot_latency.floor.calibration.DecodePoint` (its
measured step time next to the bandwidth floor). The fits built from the rows live in
:mod:`robot_latency.floor.published_fit`, the leave-one-out validation in
:mod:`robot_latency.floor.published_validation`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from robot_latency.floor.calibration import DecodePoint, check_engine_family
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import FloorError, TableError
from robot_latency.floor.modelinfo import PRESETS, ModelFacts, facts_from_preset, quant_bpw
from robot_latency.floor.predict import predict_floor
from robot_latency.floor.shapes import REFUSED_MODELS, refusal_reason

__all__ = [
    "METRICS",
    "OPTIONAL_ROW_FIELDS",
    "ROW_FIELDS",
    "NearRow",
    "PublishedRow",
    "default_table_path",
    "load_table",
    "nearest_rows",
    "not_predicted_reason",
    "published_file_bytes",
    "row_facts",
    "row_point",
    "scale_to_file",
]

#: What a row's figure measures. Only ``decode`` rows are predicted: the others carry a prefill.
METRICS: dict[str, str] = {
    "decode": "decode tokens per second (or ITL) at batch 1",
    "output_tok_s_with_prefill": ("output tokens per second over a whole request: the prefill "
                                  "of the input is inside the figure"),
}

#: Every row's fields and the types they may take (None: the source does not say).
ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "source": (str,), "url": (str,), "module": (str,),
    "power_mode": (str, type(None)), "device": (str,), "model": (str,),
    "model_reported": (str,), "quant_reported": (str,), "quant": (str,), "engine": (str,),
    "engine_family": (str,), "engine_version": (str, type(None)),
    "tok_s": (int, float, type(None)),
    "prompt_tokens": (int, type(None)), "gen_tokens": (int, type(None)), "notes": (str,),
}

_NONE = type(None)
#: Fields a row may leave out, with their types and defaults. ``itl_ms`` replaces ``tok_s`` where
#: the source prints a step time; ``file_bytes`` (the GGUF size the source states) scales the
#: bytes the shape preset counts, since small models keep many tensors above the nominal quant.
OPTIONAL_ROW_FIELDS: dict[str, tuple[tuple[type, ...], Any]] = {
    "itl_ms": ((int, float, _NONE), None),
    "file_bytes": ((int, _NONE), None),
    "build": ((str, _NONE), None),
    "date": ((str, _NONE), None),
    "clocks_locked": ((bool, _NONE), None),
    "gpu_mhz": ((int, float, _NONE), None),
    "metric": ((str,), "decode"),
}


@dataclass(frozen=True)
class PublishedRow:
    """One published decode figure (see the table's header for the fields)."""

    id: str
    source: str
    url: str
    module: str
    power_mode: str | None
    device: str
    model: str
    model_reported: str
    quant_reported: str
    quant: str
    engine: str
    engine_family: str
    engine_version: str | None
    tok_s: float
    prompt_tokens: int | None
    gen_tokens: int | None
    notes: str
    published_itl_ms: float | None = None
    file_bytes: int | None = None
    build: str | None = None
    date: str | None = None
    clocks_locked: bool | None = None
    gpu_mhz: float | None = None
    metric: str = "decode"

    @property
    def itl_ms(self) -> float:
        """The published figure as a step time (ms per token)."""
        if self.published_itl_ms is not None:
            return self.published_itl_ms
        return 1e3 / self.tok_s

    @property
    def setup(self) -> str:
        """One source's engine build on one device in one power mode: what shares an overhead."""
        return f"{self.source} | {self.device} | {self.power_mode or 'mode not stated'}"

    @property
    def context_tokens(self) -> int:
        """Mean tokens in the KV cache over the generation (prompt + half the output)."""
        return (self.prompt_tokens or 0) + (self.gen_tokens or 0) // 2


def default_table_path() -> Path:
    """Return the shipped table's path."""
    return Path(str(resources.files("robot_latency") / "data" / "published_decode.yaml"))


def _check_row(path: Path, i: int, raw: Any) -> PublishedRow:
    where = f"{path}: row {i + 1}"
    if not isinstance(raw, dict):
        raise TableError(f"{where}: must be a mapping, got {type(raw).__name__}")
    if isinstance(raw.get("id"), str):
        where = f"{path}: row {raw['id']!r}"
    missing = [k for k in ROW_FIELDS if k not in raw]
    extra = [k for k in raw if k not in ROW_FIELDS and k not in OPTIONAL_ROW_FIELDS]
    if missing or extra:
        raise TableError(f"{where}: missing fields {missing}, unknown fields {extra}")
    opt = {k: raw.get(k, default) for k, (_, default) in OPTIONAL_ROW_FIELDS.items()}
    kinds_of = {**ROW_FIELDS, **{k: kinds for k, (kinds, _) in OPTIONAL_ROW_FIELDS.items()}}
    for key, kinds in kinds_of.items():
        value = raw[key] if key in ROW_FIELDS else opt[key]
        if isinstance(value, bool) and bool not in kinds:
            raise TableError(f"{where}: field {key!r} has type bool")
        if not isinstance(value, kinds):
            raise TableError(f"{where}: field {key!r} has type {type(value).__name__}")
    rate, itl = raw["tok_s"], opt["itl_ms"]
    if (rate is None) == (itl is None):
        raise TableError(f"{where}: give exactly one of tok_s and itl_ms")
    for key, value in (("tok_s", rate), ("itl_ms", itl), ("file_bytes", opt["file_bytes"])):
        if value is not None and not value > 0:
            raise TableError(f"{where}: {key} must be > 0, got {value!r}")
    if opt["metric"] not in METRICS:
        raise TableError(f"{where}: unknown metric {opt['metric']!r}; known: "
                         f"{', '.join(METRICS)}")
    if not raw["url"].startswith("https://"):
        raise TableError(f"{where}: url must be an https address, got {raw['url']!r}")
    if raw["device"] not in DEVICES:
        raise TableError(f"{where}: unknown device {raw['device']!r}")
    if raw["model"] not in PRESETS and raw["model"] not in REFUSED_MODELS:
        raise TableError(f"{where}: unknown model preset {raw['model']!r}")
    try:
        check_engine_family(raw["engine_family"])
        quant_bpw(raw["quant"])
    except FloorError as err:
        raise TableError(f"{where}: {err}") from err
    fields = {k: v for k, v in raw.items() if k in ROW_FIELDS}
    fields["tok_s"] = float(rate) if rate is not None else 1e3 / float(itl)
    return PublishedRow(
        **fields, published_itl_ms=None if itl is None else float(itl),
        file_bytes=opt["file_bytes"], build=opt["build"], date=opt["date"],
        clocks_locked=opt["clocks_locked"],
        gpu_mhz=None if opt["gpu_mhz"] is None else float(opt["gpu_mhz"]), metric=opt["metric"])


def load_table(path: str | Path | None = None) -> list[PublishedRow]:
    """Read and check the table (the shipped one by default).

    Raises:
        TableError: naming the file, the row and the field that is wrong.
    """
    p = Path(path) if path is not None else default_table_path()
    return list(_load_cached(str(p)))


#: libyaml's safe loader where PyYAML has it (the same documents, several times faster: the
#: decode table takes a second with the pure-Python one on a busy core), else the pure-Python one.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_table_list(p: Path, key: str) -> list[Any]:
    """Return the ``key`` list of the YAML mapping in ``p`` (a published table file).

    Raises:
        TableError: the file cannot be read, is not YAML, or has no such list (names both).
    """
    try:
        doc = yaml.load(p.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except OSError as err:
        raise TableError(f"{p}: cannot read ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise TableError(f"{p}: not valid YAML ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise TableError(f"{p}: expected a mapping with a '{key}' list")
    return doc[key]


def unique_rows(p: Path, rows: list[Any]) -> tuple[Any, ...]:
    """Return ``rows`` as a tuple; a row id given twice is a TableError naming the file."""
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise TableError(f"{p}: duplicate row ids {dupes}")
    return tuple(rows)


@lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[PublishedRow, ...]:
    p = Path(path)
    return unique_rows(p, [_check_row(p, i, raw)
                           for i, raw in enumerate(read_table_list(p, "rows"))])


def not_predicted_reason(row: PublishedRow) -> str | None:
    """Return why ``row`` is not predicted (a model the floor refuses, a metric that is not pure
    decode), or None when it is."""
    reasons = []
    refused = refusal_reason(row.model)
    if refused is not None:
        reasons.append(f"the floor cannot count {refused}")
    if row.metric != "decode":
        reasons.append(f"the figure is {METRICS[row.metric]}")
    return "; ".join(reasons) or None


def row_facts(row: PublishedRow) -> ModelFacts:
    """Return the bytes the row's model reads: its shape preset at the row's quant, scaled to the
    file size the source states where it states one."""
    model = facts_from_preset(row.model, quant=row.quant)
    return model if row.file_bytes is None else scale_to_file(model, row.file_bytes)


def published_file_bytes(model_id: str, quant: str, *,
                         rows: Sequence[PublishedRow] | None = None,
                         device_id: str | None = None) -> tuple[int, str] | None:
    """Return (bytes, row id) of the GGUF size a published row states for this preset and quant.

    Small models keep many tensors above the nominal quant (a tied output head at Q6_K/Q8_0,
    K-quant fallbacks for rows not divisible by 256), so a stated file size counts their bytes
    better than the preset's bits per weight. Where rows disagree, the median size is used; the
    rows on ``device_id`` are preferred where there are some (only to name the row).
    """
    key, q = model_id.strip().lower(), quant.strip().upper()
    found = sorted((r.device != device_id, r.file_bytes, r.id)
                   for r in (rows if rows is not None else load_table())
                   if r.model == key and r.quant.upper() == q and r.file_bytes is not None)
    if not found:
        return None
    same = [f for f in found if not f[0]] or found
    size, row_id = sorted(f[1:] for f in same)[len(same) // 2]
    return size, row_id


def scale_to_file(model: ModelFacts, file_bytes: int) -> ModelFacts:
    """Return ``model`` with its weight bytes scaled to a file of ``file_bytes``."""
    scale = file_bytes / model.weight_bytes_total
    return replace(model, weight_bytes_total=file_bytes,
                   weight_bytes_per_step=round(model.weight_bytes_per_step * scale))


@lru_cache(maxsize=1024)
def row_point(row: PublishedRow) -> DecodePoint:
    """Return the row as a decode point: its step time next to its bandwidth floor, and the
    FLOPs of the step at its mode's peak beside them (``compute_ms``, for fits across modes).

    Raises:
        UnsupportedArchitectureError: the row's model is one the floor refuses.
    """
    floor = predict_floor(row_facts(row), DEVICES[row.device],
                          context_tokens=row.context_tokens)
    return DecodePoint(label=row.id, device_id=row.device, model=row.model,
                       floor_ms=floor.itl_floor_ms, measured_ms=row.itl_ms,
                       compute_ms=floor.itl_compute_floor_ms or 0.0)


@dataclass(frozen=True)
class NearRow:
    """A published row a prediction leans on: same family, same device, nearest size."""

    id: str
    device: str
    model: str
    quant: str
    published_itl_ms: float
    published_tok_s: float
    floor_ms: float
    weight_bytes_per_step: int
    power_mode: str | None
    date: str | None
    source: str
    url: str

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def nearest_rows(engine_family: str, device_id: str, weight_bytes_per_step: int, *,
                 rows: Sequence[PublishedRow] | None = None, limit: int = 3) -> list[NearRow]:
    """Return the family's predictable rows on ``device_id`` nearest in bytes per step.

    Nearest is by ``|log(row bytes / model bytes)|``. Where the device has no row of the family,
    the family's rows on every device are searched instead (the rows name their device).
    """
    family = check_engine_family(engine_family)
    table = list(rows if rows is not None else load_table())
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    pool = [r for r in mine if r.device == device_id] or mine
    target = max(1, weight_bytes_per_step)

    def distance(r: PublishedRow) -> float:
        return abs(math.log(row_facts(r).weight_bytes_per_step / target))

    out = []
    for r in sorted(pool, key=lambda r: (distance(r), r.id))[:limit]:
        point = row_point(r)
        out.append(NearRow(r.id, r.device, r.model, r.quant, r.itl_ms, r.tok_s, point.floor_ms,
                           row_facts(r).weight_bytes_per_step, r.power_mode, r.date, r.source,
                           r.url))
    return out
