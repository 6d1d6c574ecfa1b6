"""Tenure's configuration: the environment's :class:`~settings.environment.Settings`, read once at start,
and the runtime settings an admin changes without a deploy (:mod:`settings.runtime`).

Nothing here imports another Tenure package: every layer may read its settings from here.
"""

from .environment import Settings, SettingsError, current_settings, set_current_settings

__all__ = ["Settings", "SettingsError", "current_settings", "set_current_settings"]
