"""Attention modules."""
