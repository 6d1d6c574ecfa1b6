"""Tenure monitoring layer (see ARCHITECTURE.md)."""
