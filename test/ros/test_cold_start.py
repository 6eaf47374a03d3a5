"""The cold-start record's parts that need no node: the process's start on the loop's clock, and
the order check the node test relies on (robot_latency.ros.cold_start). The record itself, made
by a real node, is checked in test_first_goal.py."""

from __future__ import annotations

import time

import psutil

from robot_latency.ros.cold_start import (
    AFTER,
    ColdStart,
    clock_tick_ms,
    out_of_order,
    process_start_ns,
)


def test_the_process_started_before_now_and_when_the_kernel_says() -> None:
    start = process_start_ns()
    now = time.perf_counter_ns()
    assert start is not None and start < now
    # the same instant on the wall clock: within a tick (and the two clocks' reads) of psutil's
    age_s = (now - start) / 1e9
    wall_age_s = time.time() - psutil.Process().create_time()
    assert abs(age_s - wall_age_s) < 2.0  # loose: psutil counts from the boot second


def test_a_new_record_holds_the_process_start_then_the_node() -> None:
    cold = ColdStart()
    events = cold.to_dict()["events_ns"]
    assert list(events) == ["process_start", "node_created"]
    assert out_of_order(events) == []
    assert cold.to_dict()["process_start_resolution_ms"] == clock_tick_ms()


def test_out_of_order_names_each_broken_pair() -> None:
    assert out_of_order({"warm_up_started": 5, "warm_up_ended": 3, "ready": 2}) == [
        "warm_up_ended < warm_up_started", "ready < warm_up_ended"]
    assert out_of_order({"ready": 1}) == []  # events not recorded are not compared
    assert all(later not in earliers for later, earliers in AFTER.items())
