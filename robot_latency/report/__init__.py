"""Summaries, comparisons and reports of recorded runs."""
