"""Tenure webapp layer (see ARCHITECTURE.md)."""
