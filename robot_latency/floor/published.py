"""The shipped table of published batch-1 decode rates, and the calibrations fitted from it.

``robot_latency/data/published_decode.yaml`` holds one row per published figure (module, power
mode, model, quant, engine and version, tok/s, lengths, source address). Each row becomes a
:class:`~robot_latency.floor.calibration.DecodePoint`: its measured step time (1000 / tok/s) next
to the bandwidth floor of that model on that device.

Where the data supports it, the per-step overhead differs by device and by engine build: rows
that share a *setup* (one source's engine build on one device in one power mode) are fitted
together (scope ``setup``); a device without such a setup borrows the rows of the family on that
device (scope ``device``), and a device without rows the family's rows on every device (scope
``family``). A model the same source measured in other setups too (its other power modes) moves
its prediction by the share its step time sat above or below those setups' fits
(``model_adjustment``). ``validate_table`` predicts every row from a fit without it
(leave-one-out) and states each row's 80% interval from the leave-one-out residuals of the
*other* rows of its family; ``family_interval`` gives the same interval to predictions. Rows
whose model the source measured elsewhere and rows whose model it did not get separate
intervals: a model the table has never seen is predicted, and its interval built, from fits
without any row of that model (leave-one-model-out).

A row whose model the floor cannot count (hybrid state-space, mixture-of-experts) or whose figure
is not a pure decode rate (output tokens per second with the prefill inside it) is listed as not
predicted, with the reason.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from robot_latency.floor.calibration import (
    DEFAULT_SPREAD_REL,
    Calibration,
    DecodePoint,
    calibrate_points,
    check_engine_family,
)
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError, FloorError, TableError
from robot_latency.floor.fit import distinct_sizes
from robot_latency.floor.modelinfo import PRESETS, ModelProfile, profile_from_preset, quant_bpw
from robot_latency.floor.predict import predict_floor
from robot_latency.floor.shapes import REFUSED_MODELS, refusal_reason

__all__ = [
    "INTERVAL_COVERAGE",
    "METRICS",
    "OPTIONAL_ROW_FIELDS",
    "ROW_FIELDS",
    "ModelAdjustment",
    "NearRow",
    "PublishedRow",
    "ValidationResult",
    "default_table_path",
    "family_interval",
    "load_table",
    "model_adjustment",
    "nearest_rows",
    "not_predicted_reason",
    "published_file_bytes",
    "recent_llamacpp_summary",
    "row_point",
    "row_profile",
    "scale_to_file",
    "setup_fits",
    "table_calibration",
    "validate_table",
]

#: The share of rows the stated interval is meant to hold (an 80% interval).
INTERVAL_COVERAGE = 0.8

#: A leave-one-out error past this is reported with the row's notes (which must explain it).
OUTLIER_REL = 0.35

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


@lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[PublishedRow, ...]:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise TableError(f"{p}: cannot read ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise TableError(f"{p}: not valid YAML ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise TableError(f"{p}: expected a mapping with a 'rows' list")
    rows = [_check_row(p, i, raw) for i, raw in enumerate(doc["rows"])]
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise TableError(f"{p}: duplicate row ids {dupes}")
    return tuple(rows)


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


def row_profile(row: PublishedRow) -> ModelProfile:
    """Return the bytes the row's model reads: its shape preset at the row's quant, scaled to the
    file size the source states where it states one."""
    model = profile_from_preset(row.model, quant=row.quant)
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


def scale_to_file(model: ModelProfile, file_bytes: int) -> ModelProfile:
    """Return ``model`` with its weight bytes scaled to a file of ``file_bytes``."""
    scale = file_bytes / model.weight_bytes_total
    return replace(model, weight_bytes_total=file_bytes,
                   weight_bytes_per_step=round(model.weight_bytes_per_step * scale))


@lru_cache(maxsize=1024)
def row_point(row: PublishedRow) -> DecodePoint:
    """Return the row as a decode point: its step time next to its bandwidth floor.

    Raises:
        UnsupportedArchitectureError: the row's model is one the floor refuses.
    """
    floor = predict_floor(row_profile(row), DEVICES[row.device],
                          context_tokens=row.context_tokens)
    return DecodePoint(label=row.id, device_id=row.device, model=row.model,
                       floor_ms=floor.itl_floor_ms, measured_ms=row.itl_ms)


def _sizes(rows: Sequence[PublishedRow]) -> int:
    return distinct_sizes([row_point(r).floor_ms for r in rows]) if rows else 0


def _setup_rank(rows: Sequence[PublishedRow]) -> tuple[bool, bool, str, int]:
    """Best-documented first: clocks locked, power mode stated, newest date, most rows."""
    r = rows[0]
    return (r.clocks_locked is True, r.power_mode is not None, r.date or "", len(rows))


def _pick_setup(groups: dict[str, list[PublishedRow]], setup: str | None) -> str | None:
    """The named setup, else the best-documented of ``groups`` (None where there is none)."""
    if setup is None and groups:
        setup = max(groups.values(), key=_setup_rank)[0].setup
    return setup


def _by_setup(rows: Sequence[PublishedRow]) -> dict[str, list[PublishedRow]]:
    groups: dict[str, list[PublishedRow]] = {}
    for r in rows:
        groups.setdefault(r.setup, []).append(r)
    return groups


def _setup_overheads(rows: Sequence[PublishedRow], family: str) -> list[float]:
    """Fitted overheads of the family's setups that cover two model sizes."""
    out = []
    for group in _by_setup(rows).values():
        if len(group) >= 2 and _sizes(group) >= 2:
            cal = calibrate_points([row_point(r) for r in group], engine_family=family,
                                   device_id=group[0].device, scope="setup", source="")
            out.append(cal.overhead_ms)
    return out


def table_calibration(engine_family: str, device_id: str, *,
                      rows: Sequence[PublishedRow] | None = None,
                      exclude: str | None = None, setup: str | None = None) -> Calibration:
    """Fit the calibration of ``engine_family`` on ``device_id`` from the table's rows.

    The ladder, most specific first: the rows of ``setup`` (or, when none is named, of the
    best-documented setup on the device: clocks locked, power mode stated, newest build) when
    they cover two model sizes (scope ``setup``); one size of that setup with the overhead held
    at the median of the family's other setups (scope ``setup``, noted); every row of the family
    on the device (``device``); every row of the family (``family``). Rows the floor cannot
    predict (``not_predicted_reason``) are never used. The interval is the family's
    (``family_interval``).

    Raises:
        CalibrationError: the family has too few rows in the table to fit (naming the family and
            the families that do have rows).
    """
    family = check_engine_family(engine_family)
    table = list(rows if rows is not None else load_table())
    cal = _ladder(family, device_id, table, exclude=exclude, setup=setup)
    return replace(cal, interval_rel=family_interval(family, rows=table, exclude=exclude))


def _ladder(family: str, device_id: str, rows: Sequence[PublishedRow], *, exclude: str | None,
            setup: str | None) -> Calibration:
    """The fit of ``table_calibration``, without its interval."""
    table = [r for r in rows if r.id != exclude]
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    here = [r for r in mine if r.device == device_id]
    source = "published table"
    groups = _by_setup(here)
    setup = _pick_setup(groups, setup)
    same = groups.get(setup or "", [])
    if len(same) >= 2 and _sizes(same) >= 2:
        return calibrate_points([row_point(r) for r in same], engine_family=family,
                                device_id=device_id, scope="setup", source=source,
                                notes=(f"setup: {setup}",))
    others = [r for r in mine if r.setup != setup]
    overheads = _setup_overheads(others, family)
    if same and overheads:
        return calibrate_points([row_point(r) for r in same], engine_family=family,
                                device_id=device_id, scope="setup", source=source,
                                fixed_overhead_ms=statistics.median(overheads), quiet=True,
                                notes=(f"setup: {setup}", "overhead held at the median of the "
                                       f"family's {len(overheads)} other setups"))
    if len(here) >= 2 and _sizes(here) >= 2:
        return calibrate_points([row_point(r) for r in here], engine_family=family,
                                device_id=device_id, scope="device", source=source)
    if len(mine) >= 2 and _sizes(mine) >= 2:
        devices = sorted({r.device for r in mine})
        return calibrate_points(
            [row_point(r) for r in mine], engine_family=family, device_id=device_id,
            scope="family", source=source,
            notes=(f"no two model sizes of {family} on {device_id} in the table: fitted on "
                   f"{', '.join(devices)} (overhead assumed to carry over)",))
    have = sorted({r.engine_family for r in table})
    raise CalibrationError(
        f"the published table has too few {family} rows to fit a calibration (families with "
        f"rows: {', '.join(have)}); calibrate from runs (robot-latency calibrate) and pass "
        "--calibration")


def setup_fits(rows: Sequence[PublishedRow] | None = None) -> list[dict[str, Any]]:
    """Return the two-term fit of every setup that covers two model sizes, with its conditions.

    One entry per setup: family, device, power mode, GPU clock and date as the rows state them,
    the fitted efficiency and per-step overhead, and each row's layer count and fit residual
    (``measured / fitted - 1``), for asking what the overhead follows.
    """
    out = []
    table = [r for r in (rows if rows is not None else load_table())
             if not_predicted_reason(r) is None]
    for setup, group in sorted(_by_setup(table).items()):
        if len(group) < 2 or _sizes(group) < 2:
            continue
        r0 = group[0]
        cal = calibrate_points([row_point(r) for r in group], engine_family=r0.engine_family,
                               device_id=r0.device, scope="setup", source="published table")
        out.append({
            "setup": setup, "engine_family": r0.engine_family, "device": r0.device,
            "power_mode": r0.power_mode, "gpu_mhz": r0.gpu_mhz, "date": r0.date,
            "build": r0.build or r0.engine_version, "clocks_locked": r0.clocks_locked,
            "rows": len(group), "efficiency": cal.efficiency, "overhead_ms": cal.overhead_ms,
            "overhead_held_at_zero": cal.overhead_fixed,
            "residuals": {r.id: {"n_layers": PRESETS[r.model].n_layers, "residual_rel": res}
                          for r, res in zip(group, cal.residuals_rel, strict=True)},
        })
    return out


@dataclass(frozen=True)
class ModelAdjustment:
    """How a model's own rows in the source's other setups move its prediction in this one.

    A source that measured the same model (same build, same harness) in several setups (power
    modes of one module) shows how far that model sits from each setup's fit: its step time is
    ``measured / fitted`` of the line through the setup's *other* models, and that share (the
    model's kernel mix: layer count, attention heads, KV cache, output head; none of which the
    bytes-per-step floor sees) carries to the next setup. ``factor`` is the geometric mean of
    those shares over ``basis`` (1 where there are none).
    """

    model: str
    factor: float
    basis: tuple[str, ...]
    source: str | None

    @property
    def seen(self) -> bool:
        """True where rows of this model in other setups of the source moved the prediction."""
        return bool(self.basis)

    def note(self) -> str | None:
        """A line naming the rows behind the factor, or None where there are none."""
        if not self.basis:
            return None
        return (f"model: x{self.factor:.3f}, the geometric mean of measured / fitted of "
                f"{self.model} in {len(self.basis)} other setups of this source "
                f"({', '.join(self.basis)})")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"model": self.model, "factor": self.factor, "basis": list(self.basis),
                "source": self.source, "seen": self.seen}


def model_adjustment(engine_family: str, device_id: str, model_id: str, *,
                     rows: Sequence[PublishedRow] | None = None, setup: str | None = None,
                     exclude: str | None = None) -> ModelAdjustment:
    """Return the factor by which ``model_id``'s rows in other setups move its prediction.

    The setup is ``setup`` or the one ``table_calibration`` picks on ``device_id``; its source's
    rows of the same shape preset in *other* setups are each predicted from their own setup's
    fit without them (and without ``exclude``), and ``factor`` is the geometric mean of
    ``measured / predicted`` over them. A model with no such row (a file, a config.json, a
    preset the source did not measure, a device without a setup) gets 1.
    """
    family = check_engine_family(engine_family)
    key = model_id.strip().lower()
    table = [r for r in (rows if rows is not None else load_table()) if r.id != exclude]
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    setup = _pick_setup(_by_setup([r for r in mine if r.device == device_id]), setup)
    source = next((r.source for r in mine if r.setup == setup), None)
    logs: list[float] = []
    basis: list[str] = []
    for q in mine:
        if q.model != key or q.source != source or q.setup == setup:
            continue
        try:
            cal = _ladder(family, q.device, table, exclude=q.id, setup=q.setup)
        except CalibrationError:
            continue
        logs.append(math.log(q.itl_ms / (row_point(q).floor_ms / cal.efficiency
                                          + cal.overhead_ms)))
        basis.append(q.id)
    factor = math.exp(statistics.fmean(logs)) if logs else 1.0
    return ModelAdjustment(key, factor, tuple(basis), source)


@lru_cache(maxsize=256)
def _loo_predictions(
        table: tuple[PublishedRow, ...]) -> dict[str, tuple[float, str, str, ModelAdjustment]]:
    """Each predictable row's step time predicted without it: id -> (ms, scope, note, model).

    The row's setup fit without it, moved by its model's rows in the source's other setups
    (``model_adjustment``, also without it). Rows whose family has no fit left without them are
    absent (``validate_table`` gives the reason).
    """
    out: dict[str, tuple[float, str, str, ModelAdjustment]] = {}
    for row in table:
        if not_predicted_reason(row) is not None:
            continue
        try:
            cal = _loo_calibration(row, table)
        except CalibrationError:
            continue
        adj = model_adjustment(row.engine_family, row.device, row.model, rows=table,
                               setup=row.setup, exclude=row.id)
        pred = (row_point(row).floor_ms / cal.efficiency + cal.overhead_ms) * adj.factor
        notes = (*cal.notes, adj.note()) if adj.seen else cal.notes
        out[row.id] = (pred, cal.scope, "; ".join(n for n in notes if n), adj)
    return out


@lru_cache(maxsize=256)
def _new_model_predictions(table: tuple[PublishedRow, ...]) -> dict[str, float]:
    """Each predictable row's step time predicted as if its model were new: id -> ms.

    Every row of the row's shape preset is left out of the fit (leave-one-model-out), so no
    measurement of that model moves the prediction: what a model the table has never seen gets.
    """
    out: dict[str, float] = {}
    for row in table:
        if not_predicted_reason(row) is not None:
            continue
        rest = [r for r in table if r.model != row.model]
        try:
            cal = _ladder(row.engine_family, row.device, rest, exclude=None, setup=row.setup)
        except CalibrationError:
            continue
        out[row.id] = row_point(row).floor_ms / cal.efficiency + cal.overhead_ms
    return out


def _loo_calibration(row: PublishedRow, table: Sequence[PublishedRow]) -> Calibration:
    # without the interval, which is built from these very predictions
    return _ladder(row.engine_family, row.device, table, exclude=row.id, setup=row.setup)


def family_interval(engine_family: str, *, rows: Sequence[PublishedRow] | None = None,
                    exclude: str | None = None,
                    model_seen: bool = False) -> tuple[float, float]:
    """Return the family's 80% interval as (lo, hi) relative bounds on a prediction.

    The bounds are order statistics of ``measured / predicted - 1`` over the family's rows,
    ``exclude`` left out of the residuals and of every fit behind them: the
    ``ceil(0.9 (n + 1))``-th largest and ``floor(0.1 (n + 1))``-th smallest (a split-conformal
    interval; the extreme residual where n is too small). For a
    model the table has not measured (``model_seen`` False, the default) each row of the family
    is predicted without any row of its model (leave-one-model-out); for a model moved by its
    own rows in other setups (``model_adjustment``), the residuals are those of every row
    predicted the same way, each without itself (leave-one-out), pooled over the engine
    families where there are three or more: what they measure is how a model's departure from
    its setup's fit carries from one power mode of a module to another under one harness, not
    the engine's own fit, and one family's few sources (MLC: one source, two modes) give too
    few of them for an 80% order statistic. Fewer than three residuals give the default
    spread.
    """
    family = check_engine_family(engine_family)
    # without ``exclude`` everywhere: the other rows' residuals are predicted from a table
    # that never held it (nested leave-one-out), so it moves nothing its own interval uses
    table = tuple(r for r in (rows if rows is not None else load_table()) if r.id != exclude)
    mine = [row for row in table if row.engine_family == family]
    preds = _loo_predictions(table)
    res = sorted(row.itl_ms / preds[row.id][0] - 1.0 for row in table
                 if row.id in preds and preds[row.id][3].seen)
    if not model_seen or len(res) < 3:
        new = _new_model_predictions(table)
        res = sorted(row.itl_ms / new[row.id] - 1.0 for row in mine if row.id in new)
    if len(res) < 3:
        return (-DEFAULT_SPREAD_REL, DEFAULT_SPREAD_REL)
    n, tail = len(res), (1.0 - INTERVAL_COVERAGE) / 2
    k_lo = max(1, math.floor(tail * (n + 1)))
    k_hi = min(n, math.ceil((1.0 - tail) * (n + 1)))
    return (min(0.0, res[k_lo - 1]), max(0.0, res[k_hi - 1]))


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
        return abs(math.log(row_profile(r).weight_bytes_per_step / target))

    out = []
    for r in sorted(pool, key=lambda r: (distance(r), r.id))[:limit]:
        point = row_point(r)
        out.append(NearRow(r.id, r.device, r.model, r.quant, r.itl_ms, r.tok_s, point.floor_ms,
                           row_profile(r).weight_bytes_per_step, r.power_mode, r.date, r.source,
                           r.url))
    return out


@dataclass(frozen=True)
class ValidationResult:
    """One row predicted from a fit without it."""

    id: str
    engine_family: str
    device: str
    model: str
    quant: str
    published_tok_s: float
    floor_ms: float | None
    measured_ms: float
    predicted_ms: float | None
    error_rel: float | None
    scope: str | None
    reason: str | None
    setup: str | None = None
    power_mode: str | None = None
    clocks_locked: bool | None = None
    build: str | None = None
    date: str | None = None
    source: str | None = None
    url: str | None = None
    interval_ms: tuple[float, float] | None = None
    inside_interval: bool | None = None
    fit_notes: str | None = None
    notes: str | None = None
    model_factor: float | None = None
    model_basis: tuple[str, ...] = ()
    new_model_predicted_ms: float | None = None
    new_model_error_rel: float | None = None
    new_model_interval_ms: tuple[float, float] | None = None
    new_model_inside_interval: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def validate_table(rows: Sequence[PublishedRow] | None = None) -> dict[str, Any]:
    """Predict every row from a calibration fitted without it; return rows and error summary.

    ``error_rel`` is ``predicted / measured - 1`` (on the step time). Each predicted row also
    gets the 80% interval a prediction would state without it (``family_interval``) and whether
    its published figure falls inside. The ``new_model_*`` fields and summaries repeat this with
    every row of the row's model left out (leave-one-model-out): the error a model the table
    has never measured gets. Rows the floor cannot predict, and rows whose family has
    no fit left without them, are listed with a reason and left out of the summary.
    """
    table = tuple(rows if rows is not None else load_table())
    preds = _loo_predictions(table)
    new_preds = _new_model_predictions(table)
    results: list[ValidationResult] = []
    for row in table:
        why = not_predicted_reason(row)
        point = None if why is not None else row_point(row)
        floor_ms = point.floor_ms if point is not None else None
        meta = dict(setup=row.setup, power_mode=row.power_mode, clocks_locked=row.clocks_locked,
                    build=row.build or row.engine_version, date=row.date, source=row.source,
                    url=row.url)
        if why is None and row.id not in preds:
            try:
                _loo_calibration(row, table)
            except CalibrationError as err:
                why = str(err)
        if why is not None:
            results.append(ValidationResult(
                row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
                floor_ms, row.itl_ms, None, None, None, why, **meta))
            continue
        assert point is not None
        pred, scope, note, adj = preds[row.id]
        lo, hi = _interval_ms(row, table, pred, point.floor_ms, model_seen=adj.seen)
        err = pred / point.measured_ms - 1.0
        new = new_preds.get(row.id)
        new_lo_hi = (None if new is None else
                     _interval_ms(row, table, new, point.floor_ms, model_seen=False))
        results.append(ValidationResult(
            row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
            point.floor_ms, point.measured_ms, pred, err, scope, None, **meta,
            interval_ms=(lo, hi), inside_interval=lo <= point.measured_ms <= hi,
            fit_notes=note or None,
            notes=row.notes if abs(err) > OUTLIER_REL else None,
            model_factor=adj.factor, model_basis=adj.basis,
            new_model_predicted_ms=new,
            new_model_error_rel=None if new is None else new / point.measured_ms - 1.0,
            new_model_interval_ms=new_lo_hi,
            new_model_inside_interval=(None if new_lo_hi is None else
                                       new_lo_hi[0] <= point.measured_ms <= new_lo_hi[1])))
    errors = [abs(r.error_rel) for r in results if r.error_rel is not None]
    by_family: dict[str, dict[str, Any]] = {}
    for family in sorted({r.engine_family for r in results}):
        done = [r for r in results if r.engine_family == family and r.error_rel is not None]
        errs = [abs(r.error_rel) for r in done]
        inside = sum(1 for r in done if r.inside_interval)
        by_family[family] = {
            "predicted": len(errs),
            "not_predicted": sum(1 for r in results
                                 if r.engine_family == family and r.error_rel is None),
            "median_abs_error": statistics.median(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None,
            "inside_80": inside,
            "coverage_80": inside / len(done) if done else None,
            "interval_rel": list(family_interval(family, rows=table)),
            "scopes": {s: sum(1 for r in done if r.scope == s)
                       for s in sorted({r.scope for r in done if r.scope})},
            "model_adjusted": sum(1 for r in done if r.model_basis),
            "interval_rel_model_seen": list(family_interval(family, rows=table,
                                                            model_seen=True)),
            **_new_model_summary(done),
        }
    return {
        "rows": [r.to_dict() for r in results],
        "by_family": by_family,
        "predicted": len(errors),
        "not_predicted": len(results) - len(errors),
        "sources": len({r.source for r in table}),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "past_35_percent": [r.id for r in results
                            if r.error_rel is not None and abs(r.error_rel) > OUTLIER_REL],
        "recent_llamacpp": recent_llamacpp_summary(table),
        **_new_model_summary([r for r in results if r.error_rel is not None]),
        "new_model_past_35_percent": [
            r.id for r in results
            if r.new_model_error_rel is not None and abs(r.new_model_error_rel) > OUTLIER_REL],
        "setups": [{k: v for k, v in f.items() if k != "residuals"} for f in setup_fits(table)],
    }


def _interval_ms(row: PublishedRow, table: tuple[PublishedRow, ...], pred_ms: float,
                 floor_ms: float, *, model_seen: bool) -> tuple[float, float]:
    """The 80% interval a prediction of ``row`` states without it (never below the floor)."""
    lo_rel, hi_rel = family_interval(row.engine_family, rows=table, exclude=row.id,
                                     model_seen=model_seen)
    return max(floor_ms, pred_ms * (1.0 + lo_rel)), pred_ms * (1.0 + hi_rel)


def _new_model_summary(done: Sequence[ValidationResult]) -> dict[str, Any]:
    """Error and coverage of the predictions made as if each row's model were new."""
    new = [r for r in done if r.new_model_error_rel is not None]
    errs = [abs(r.new_model_error_rel) for r in new if r.new_model_error_rel is not None]
    inside = sum(1 for r in new if r.new_model_inside_interval)
    return {
        "new_model_predicted": len(errs),
        "new_model_median_abs_error": statistics.median(errs) if errs else None,
        "new_model_max_abs_error": max(errs) if errs else None,
        "new_model_inside_80": inside,
        "new_model_coverage_80": inside / len(new) if new else None,
    }


def recent_llamacpp_summary(rows: Sequence[PublishedRow], *, since: str = "2025",
                            small_params: int = 1_500_000_000) -> dict[str, Any]:
    """Count the llama.cpp-CUDA rows measured with builds from ``since`` on (by the row's date):
    rows, sources, devices and rows on models of ``small_params`` or fewer, predicted or not."""
    recent = [r for r in rows if r.engine_family == "llamacpp-cuda" and (r.date or "") >= since]
    predictable = [r for r in recent if not_predicted_reason(r) is None]
    small = [r for r in predictable if PRESETS[r.model].param_count() <= small_params]
    return {
        "rows": len(recent),
        "predicted": len(predictable),
        "sources": sorted({r.source for r in recent}),
        "devices": sorted({r.device for r in recent}),
        "modules": len({DEVICES[r.device].family for r in recent}),
        "small_model_rows": len(small),
    }
