"""Markdown tables and the numbers in them: one renderer, one number formatter.

A table is rendered aligned (each column padded to its widest cell: readable on a terminal,
pasteable into docs) or compact (``| a | b |`` under ``|---|---|``: the report's tables, whose
cells can be long). A number is ``-`` when unknown (None), never a silent 0.
"""

from __future__ import annotations

from collections.abc import Sequence


def n_sources(n: int) -> str:
    """``1 source``, ``3 sources``, ``no source``: what a figure rests on, counted."""
    return "no source" if n == 0 else f"{n} source{'' if n == 1 else 's'}"


def fmt(value: float | None, spec: str = ".2f") -> str:
    """Return ``value`` formatted with ``spec``, or ``-`` for None."""
    return "-" if value is None else format(value, spec)


def pct(rate: float | None) -> str:
    """Return a rate in [0, 1] as a percentage with one decimal (``12.5%``), ``-`` for None."""
    return "-" if rate is None else f"{100 * rate:.1f}%"


def rate_ci(rate: float | None, lo: float | None, hi: float | None) -> str:
    """Return a rate with its interval, ``12.5% [8.1, 18.0]`` (points), as far as known."""
    if rate is None or lo is None or hi is None:
        return pct(rate)
    return f"{pct(rate)} [{100 * lo:.1f}, {100 * hi:.1f}]"


def markdown_lines(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                   aligned: bool = True) -> list[str]:
    """Return the lines of a Markdown table of ``rows`` under ``headers``.

    Args:
        headers: the column names.
        rows: the cells of each row, already text.
        aligned: pad each column to its widest cell (every row must then have one cell per
            header); False: the compact form, ``---`` under every header.
    """
    widths = ([max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
               for i, h in enumerate(headers)] if aligned else None)

    def line(cells: Sequence[str]) -> str:
        if widths is None:
            return "| " + " | ".join(cells) + " |"
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    dashes = ["---"] * len(headers) if widths is None else ["-" * (w + 2) for w in widths]
    return [line(headers), "|" + "|".join(dashes) + "|", *(line(r) for r in rows)]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                   aligned: bool = True) -> str:
    """Render ``rows`` under ``headers`` as a Markdown table (:func:`markdown_lines`, joined)."""
    return "\n".join(markdown_lines(headers, rows, aligned=aligned))


def human_bytes(n: int | None) -> str | None:
    """Return a byte count in binary units (``"4.1 GiB"``), or None."""
    if n is None:
        return None
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
