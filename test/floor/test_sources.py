"""Predictions that survive a bad source: the flag, the set-aside rule, leave-one-source-out."""

from __future__ import annotations

from dataclasses import replace

from robot_latency.floor.published import load_table, table_calibration
from robot_latency.floor.published_checks import device_stability, leave_one_source_out
from robot_latency.floor.published_fit import _ladder
from robot_latency.floor.published_sources import (
    SOURCE_DISAGREEMENT_FACTOR,
    flagged_sources,
    source_checks,
)
from robot_latency.floor.published_table import PublishedRow, not_predicted_reason

NIXOS = "jetpack-nixos cross-framework benchmark (AGX Orin, llama-bench)"
HOLOHUB = "holohub issue 170 (llama.cpp on IGX/AGX Orin)"
ZOE = "zoe-ai-assistant Orin NX model report (llama.cpp server)"


def _slowed(rows: list[PublishedRow], source: str, factor: float) -> list[PublishedRow]:
    """The table with every step time of ``source`` multiplied by ``factor``."""
    return [replace(r, tok_s=r.tok_s / factor,
                    published_itl_ms=None if r.published_itl_ms is None
                    else r.published_itl_ms * factor) if r.source == source else r
            for r in rows]


def test_a_source_far_from_the_others_is_flagged() -> None:
    table = load_table()
    checks = {c.source: c for c in source_checks(tuple(table), "llamacpp-cuda")}
    # the shipped table: jetpack-nixos's AGX Orin rows are ~3x slower than the others predict
    assert checks[NIXOS].flagged and checks[NIXOS].ratio > SOURCE_DISAGREEMENT_FACTOR
    assert not checks[ZOE].flagged and not checks[HOLOHUB].flagged
    # the same rows scaled by 5: the Orin NX source is flagged, with the factor in its reason
    slowed = _slowed(table, ZOE, 5.0)
    check = {c.source: c for c in source_checks(tuple(slowed), "llamacpp-cuda")}[ZOE]
    assert check.flagged and check.ratio > 3.0 and "past the x2 flag" in check.reason


def test_a_flagged_source_cannot_alone_set_a_device_answer() -> None:
    table = load_table()
    cal = table_calibration("llamacpp-cuda", "orin-agx-64gb")
    assert NIXOS in flagged_sources(table, "llamacpp-cuda")
    assert cal.set_aside == (NIXOS,) and NIXOS not in cal.sources
    assert not any(b.startswith("nixos-") for b in cal.basis)
    assert any(NIXOS in n for n in cal.notes)
    # the answer is the one the device gets from the other sources
    without = [r for r in table if r.source != NIXOS]
    other = table_calibration("llamacpp-cuda", "orin-agx-64gb", rows=without)
    assert (cal.efficiency, cal.overhead_ms) == (other.efficiency, other.overhead_ms)
    # its rows still predict its own setup
    nixos_row = next(r for r in table if r.source == NIXOS)
    own = _ladder("llamacpp-cuda", "orin-agx-64gb", table, exclude=None, setup=nixos_row.setup)
    assert set(own.basis) == {r.id for r in table if r.source == NIXOS}


def test_a_device_with_only_a_flagged_source_falls_back_to_the_others() -> None:
    table = _slowed(load_table(), ZOE, 5.0)
    cal = table_calibration("llamacpp-cuda", "orin-nx-16gb-super", rows=table)
    # the family's rows, every flagged source set aside (the AGX Orin one too)
    assert cal.scope == "family" and set(cal.set_aside) == {ZOE, NIXOS}
    assert ZOE not in cal.sources and not any(b.startswith("zoe-") for b in cal.basis)
    # unflagged, the same device's answer is the source's own setup
    plain = table_calibration("llamacpp-cuda", "orin-nx-16gb-super")
    assert plain.scope == "setup" and plain.sources == (ZOE,) and plain.set_aside == ()


def test_leave_one_source_out_never_uses_the_source() -> None:
    table = load_table()
    out = leave_one_source_out(table)
    rows = [r for r in out["rows"] if r["engine_family"] == "llamacpp-cuda"]
    predictable = [r for r in table if r.engine_family == "llamacpp-cuda"
                   and not_predicted_reason(r) is None]
    assert len(rows) == len(predictable)
    for r in rows:
        assert r["error_rel"] is not None and r["source"] not in r["rests_on"]
    assert out["by_family"]["llamacpp-cuda"]["predicted"] == len(rows)
    by_source = out["by_source"]
    assert sum(s["rows"] for s in by_source.values()) == len(out["rows"])


def test_device_stability_reports_every_device_and_source() -> None:
    out = device_stability("llamacpp-cuda")
    assert "orin-agx-64gb" in out["devices"] and NIXOS in out["sources"]
    for d in out["devices"].values():
        assert d["max_ratio"] >= 1.0
        for m in d["models"].values():
            assert set(m["itl_ms"]) == {"(none)", *out["sources"]}
    assert out["max_ratio"] == max(d["max_ratio"] for d in out["devices"].values())


SMOLHUB = "smolhub tiny-LLM benchmark (Orin Nano Super, llama.cpp, 4 power modes)"


def test_a_device_without_rows_answers_from_its_module_before_the_family() -> None:
    table = load_table()
    # without smolhub the Orin Nano Super's 25W mode has no row: its answer is the same module's
    # other modes (tiny_agent's MAXN_SUPER row, each row against its own mode's floor), not the
    # family's rows on every module
    without = [r for r in table if r.source != SMOLHUB]
    cal = table_calibration("llamacpp-cuda", "orin-nano-8gb-super-25w", rows=without)
    nano = {r.id for r in without if r.engine_family == "llamacpp-cuda"
            and r.device.startswith("orin-nano") and not_predicted_reason(r) is None}
    assert cal.scope == "module" and set(cal.basis) == nano
    assert any("same module" in n for n in cal.notes)
    # AGX Orin 32GB has no row: the AGX Orin 64GB rows answer, the flagged source set aside
    agx = table_calibration("llamacpp-cuda", "orin-agx-32gb")
    assert agx.scope == "module" and NIXOS in agx.set_aside and NIXOS not in agx.sources
    assert agx.basis and all(b.startswith(("holohub-", "mllms-")) for b in agx.basis)
    # a module with no predictable row of the family still falls to the family's rows
    assert table_calibration("llamacpp-cuda", "thor-t5000").scope == "family"
