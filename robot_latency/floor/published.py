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

The table and its rows (and the nearest rows) live in :mod:`robot_latency.floor.published_table`,
the fits and intervals in :mod:`robot_latency.floor.published_fit`, the leave-one-out validation
in :mod:`robot_latency.floor.published_validation`; the prefill table and its fit in
:mod:`robot_latency.floor.published_prefill`, the check of each source against the others in
:mod:`robot_latency.floor.published_sources`, and leave-one-source-out, device stability and the
prefill validation in :mod:`robot_latency.floor.published_checks`. This module gathers the
decode table's public names.
"""

from __future__ import annotations

from robot_latency.floor.published_fit import (
    INTERVAL_COVERAGE,
    ModelAdjustment,
    family_interval,
    model_adjustment,
    setup_fits,
)
from robot_latency.floor.published_support import table_calibration
from robot_latency.floor.published_table import (
    METRICS,
    OPTIONAL_ROW_FIELDS,
    ROW_FIELDS,
    NearRow,
    PublishedRow,
    default_table_path,
    load_table,
    nearest_rows,
    not_predicted_reason,
    published_file_bytes,
    row_facts,
    row_point,
    scale_to_file,
)
from robot_latency.floor.published_validation import (
    OUTLIER_REL,
    ValidationResult,
    recent_llamacpp_summary,
    validate_table,
)

__all__ = [
    "INTERVAL_COVERAGE",
    "METRICS",
    "OPTIONAL_ROW_FIELDS",
    "OUTLIER_REL",
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
    "row_facts",
    "row_point",
    "scale_to_file",
    "setup_fits",
    "table_calibration",
    "validate_table",
]
