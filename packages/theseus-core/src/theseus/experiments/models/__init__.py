"""Experiments per model family."""
