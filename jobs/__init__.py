"""Tenure jobs layer (see ARCHITECTURE.md)."""
