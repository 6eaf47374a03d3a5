"""The two-term fit: exact on data generated from known parameters, refusals when ill-posed."""

from __future__ import annotations

import logging

import pytest

from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.fit import distinct_sizes, fit_two_term, leave_one_out

# (efficiency, overhead ms): llama.cpp-like, MLC-like, and no overhead at all
KNOWN = [(0.61, 13.8), (0.98, 6.25), (0.4, 0.0), (1.0, 0.5)]
FLOORS_MS = [0.9, 4.6, 12.3, 16.7, 41.8, 194.6]


@pytest.mark.parametrize(("efficiency", "overhead_ms"), KNOWN)
def test_fit_recovers_known_parameters_exactly(efficiency: float, overhead_ms: float) -> None:
    measured = [x / efficiency + overhead_ms for x in FLOORS_MS]
    fit = fit_two_term(FLOORS_MS, measured)
    assert fit.efficiency == pytest.approx(efficiency, rel=1e-9)
    assert fit.overhead_ms == pytest.approx(overhead_ms, abs=1e-9)
    assert fit.n_points == len(FLOORS_MS) and fit.n_sizes == len(FLOORS_MS)
    assert max(abs(r) for r in fit.residuals_rel) < 1e-9
    # leave-one-out on exact data predicts every point exactly too
    assert all(abs(e) < 1e-9 for e in leave_one_out(FLOORS_MS, measured) if e is not None)


def test_two_points_are_enough_and_predict_a_third() -> None:
    fit = fit_two_term([4.6, 16.7], [7.8, 20.3])
    # the host figures: 135M and 0.5B fitted, 360M (floor 12.3) measured 15.7
    assert fit.predict_ms(12.3) == pytest.approx(15.7, rel=0.02)
    assert fit.overhead_ms > 0 and 0 < fit.efficiency <= 1.2


def test_single_size_is_refused() -> None:
    with pytest.raises(CalibrationError, match="model size"):
        fit_two_term([10.0, 10.05, 10.1], [20.0, 20.5, 19.5])


def test_single_size_with_fixed_overhead_fits_efficiency_alone() -> None:
    fit = fit_two_term([10.0, 10.0], [25.0, 25.0], fixed_overhead_ms=5.0)
    assert fit.overhead_fixed and fit.overhead_ms == 5.0
    assert fit.efficiency == pytest.approx(0.5)


def test_negative_overhead_is_refitted_at_zero(caplog: pytest.LogCaptureFixture) -> None:
    # points that a free line would cross the axis below zero
    with caplog.at_level(logging.INFO, logger="robot_latency.floor.fit"):
        fit = fit_two_term([10.0, 20.0], [15.0, 40.0])
    assert fit.overhead_fixed and fit.overhead_clamped and fit.overhead_ms == 0.0
    # not at INFO: the published table's validation runs hundreds of fits (one summary line)
    assert "refitting" not in caplog.text
    with caplog.at_level(logging.DEBUG, logger="robot_latency.floor.fit"):
        fit_two_term([10.0, 20.0], [15.0, 40.0])
    assert "refitting" in caplog.text
    assert not fit_two_term([10.0, 20.0], [15.0, 25.0]).overhead_clamped


@pytest.mark.parametrize(("floors", "measured", "match"), [
    ([], [], "no points"),
    ([1.0, 2.0], [1.0], "measurements"),
    ([1.0, -2.0], [3.0, 4.0], "finite"),
    ([1.0, 2.0], [3.0, float("nan")], "finite"),
    ([1.0, 2.0], [5.0, 3.0], "not positive"),
])
def test_bad_points(floors: list[float], measured: list[float], match: str) -> None:
    with pytest.raises(CalibrationError, match=match):
        fit_two_term(floors, measured)


def test_distinct_sizes_groups_near_equal_floors() -> None:
    assert distinct_sizes([10.0, 10.1, 20.0, 20.3, 40.0]) == 3


def test_leave_one_out_marks_points_that_cannot_be_predicted() -> None:
    # two sizes only: dropping one leaves a single size
    assert leave_one_out([1.0, 2.0], [3.0, 4.0]) == [None, None]
