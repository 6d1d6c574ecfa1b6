"""Tenure migrations layer (docs/architecture.md)."""
