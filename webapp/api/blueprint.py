"""The API's blueprint class: JSON bodies are parsed as standard JSON only (:mod:`webapp.strict_json`)."""

from __future__ import annotations

import flask_smorest

from ..strict_json import StrictJsonParser


class Blueprint(flask_smorest.Blueprint):
    """A flask-smorest blueprint whose JSON bodies are standard JSON (no NaN, no lone surrogates, bounded depth)."""

    ARGUMENTS_PARSER = StrictJsonParser()
