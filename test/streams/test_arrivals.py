"""Arrival processes (structure and statistics under fixed seeds) and stream files from them."""

from __future__ import annotations

import numpy as np
import pytest

from robot_latency.streams import arrival_times_ns, make_stream, make_stream_file, read_stream

N = 20_000
RATE_HZ = 8.0


def _gaps(times: list[int]) -> np.ndarray:
    return np.diff(np.asarray(times, dtype=np.int64))


def _rate_hz(times: list[int]) -> float:
    return (len(times) - 1) / (times[-1] / 1e9)


def _cv(times: list[int]) -> float:
    gaps = _gaps(times).astype(float)
    return float(gaps.std() / gaps.mean())


def test_periodic_spacing_is_exact():
    assert arrival_times_ns(5, process="periodic", rate_hz=4.0, seed=0) == [
        0,
        250_000_000,
        500_000_000,
        750_000_000,
        1_000_000_000,
    ]
    times = arrival_times_ns(1_000, process="periodic", rate_hz=3.0, seed=0)
    # 1/3 s does not divide into whole ns; rounding the running total keeps every gap within 1 ns
    # and the total exact.
    assert set(_gaps(times).tolist()) <= {333_333_333, 333_333_334}
    assert times[-1] == 333_000_000_000


@pytest.mark.parametrize("process", ["periodic", "poisson", "bursty"])
def test_times_start_at_zero_and_never_decrease(process):
    times = arrival_times_ns(1_000, process=process, rate_hz=RATE_HZ, seed=3)

    assert len(times) == 1_000
    assert times[0] == 0
    assert all(isinstance(t, int) for t in times)
    assert (_gaps(times) >= 0).all()


@pytest.mark.parametrize(("process", "tolerance"), [("poisson", 0.03), ("bursty", 0.05)])
def test_mean_rate_matches(process, tolerance):
    times = arrival_times_ns(N, process=process, rate_hz=RATE_HZ, seed=11)

    assert _rate_hz(times) == pytest.approx(RATE_HZ, rel=tolerance)


def test_bursty_with_given_gap_keeps_mean_rate_and_quiet_gap():
    times = arrival_times_ns(
        N, process="bursty", rate_hz=RATE_HZ, seed=5, burst_size=4, burst_gap_s=0.4
    )
    quiet = _gaps(times)[3::4] / 1e9  # every 4th gap ends a burst

    assert _rate_hz(times) == pytest.approx(RATE_HZ, rel=0.05)
    assert quiet.mean() == pytest.approx(0.4, rel=0.05)


def test_bursty_gaps_vary_more_than_poisson():
    poisson = _cv(arrival_times_ns(N, process="poisson", rate_hz=RATE_HZ, seed=2))
    bursty = _cv(arrival_times_ns(N, process="bursty", rate_hz=RATE_HZ, seed=2))

    assert poisson == pytest.approx(1.0, abs=0.05)  # exponential gaps
    assert bursty > 1.5 * poisson


@pytest.mark.parametrize("process", ["poisson", "bursty"])
def test_same_seed_same_times_other_seed_other_times(process):
    first = arrival_times_ns(200, process=process, rate_hz=RATE_HZ, seed=42)

    assert arrival_times_ns(200, process=process, rate_hz=RATE_HZ, seed=42) == first
    assert arrival_times_ns(200, process=process, rate_hz=RATE_HZ, seed=43) != first


def test_small_counts():
    assert arrival_times_ns(0, process="poisson", rate_hz=1.0, seed=0) == []
    assert arrival_times_ns(1, process="bursty", rate_hz=1.0, seed=0) == [0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"process": "gamma"}, "Unknown arrival process"),
        ({"rate_hz": 0.0}, "rate_hz"),
        ({"rate_hz": float("nan")}, "rate_hz"),
        ({"process": "bursty", "burst_size": 1}, "burst_size"),
        ({"process": "bursty", "burst_gap_s": 10.0}, "burst_gap_s"),
    ],
)
def test_bad_parameters_are_rejected(kwargs, match):
    args = {"process": "poisson", "rate_hz": 2.0, "seed": 0, **kwargs}

    with pytest.raises(ValueError, match=match):
        arrival_times_ns(10, **args)


def test_make_stream_pairs_texts_with_times():
    texts = ["stop", "drive to the loading dock and wait there until the forklift leaves", "go"]

    commands = make_stream(texts, process="periodic", rate_hz=2.0, seed=0, name="steady")

    assert [(c.t_ns, c.text, c.command_id) for c in commands] == [
        (0, "stop", "steady:0"),
        (500_000_000, texts[1], "steady:1"),
        (1_000_000_000, "go", "steady:2"),
    ]


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_make_stream_file_reads_back(tmp_path, storage):
    texts = ["stop", "pick up the blue box on the second shelf and place it in the bin"] * 10

    bag = make_stream_file(
        tmp_path / "bursty_ops", texts, process="bursty", rate_hz=2.0, seed=7, storage=storage
    )

    stream = read_stream(bag)
    assert [c.text for c in stream.commands] == texts
    assert [c.t_ns for c in stream.commands] == arrival_times_ns(
        len(texts), process="bursty", rate_hz=2.0, seed=7
    )
    assert stream.commands[0].command_id == "bursty_ops:0"
