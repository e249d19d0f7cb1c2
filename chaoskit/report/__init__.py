"""Outputs of a run: terminal summary, JSON (and later HTML, JUnit)."""
