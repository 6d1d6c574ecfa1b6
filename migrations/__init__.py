"""Tenure migrations layer (see ARCHITECTURE.md)."""
