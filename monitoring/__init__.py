"""Tenure monitoring layer (docs/architecture.md)."""
