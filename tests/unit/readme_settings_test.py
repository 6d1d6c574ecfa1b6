"""The README's configuration table and the one ``Settings`` cannot drift apart.

Every variable ``Settings`` reads has a row (with its default and when a change takes effect);
every ``TENURE_*`` row is either a ``Settings`` variable, one of the web process's own or the default
of a command's option, which must really be read where the table says; and no module but
``settings/environment.py`` reads a ``Settings`` variable from the environment.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from settings.environment import NEW_JOBS, RESTART, Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: Variables of the web process (Flask's ``TENURE_WEB_*`` prefix, gunicorn.conf.py): file → variables.
WEB_VARIABLES = {
    "webapp/services.py": {"TENURE_SECRET_KEY"},
    "gunicorn.conf.py": {
        "TENURE_WEB_WORKERS",
        "TENURE_WEB_THREADS",
        "TENURE_WEB_BIND",
        "TENURE_WEB_LIVE_MAX_CONNECTIONS",
    },
}
#: Options of the long-running commands (``--metrics-*`` defaults), read where the CLI parses them.
COMMAND_VARIABLES = {
    "tenure_cli/metrics.py": {
        "TENURE_METRICS_PORT",
        "TENURE_METRICS_BIND",
        "TENURE_METRICS_DIR",
        "TENURE_METRICS_TOKEN_FILE",
    },
}
#: Read by the web app factory through ``app.config.from_prefixed_env("TENURE_WEB")``: DEFAULTS keys.
WEB_PREFIXED = {
    "TENURE_WEB_LIVE_MAX_PER_IDENTITY",
    "TENURE_WEB_ALLOWED_ORIGINS",
    "TENURE_WEB_METRICS_PUBLIC",
    "TENURE_WEB_PASSWORD_SCRYPT_N",
}
#: Defaults the README states in words (derived from other settings or found at run time).
DESCRIBED_DEFAULTS = {"broker_url", "recovery_interval_s", "ffmpeg"}


def readme_rows() -> dict[str, tuple[str, str]]:
    """Variable → (default cell, takes-effect cell) of the README's configuration table."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0])
        defaults = [d.strip() for d in cells[1].split(" / ")] if len(names) > 1 else [cells[1]]
        for i, name in enumerate(names):
            rows[name] = (defaults[min(i, len(defaults) - 1)], cells[3])
    return rows


def test_every_settings_variable_has_a_readme_row_with_its_default_and_effect() -> None:
    rows = readme_rows()
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for var in Settings.variables():
        assert var.env in rows, f"README configuration table lacks {var.env}"
        default_cell, effect_cell = rows[var.env]
        assert var.effect in (RESTART, NEW_JOBS)
        assert effect_cell.startswith(var.effect), f"{var.env}: README says {effect_cell!r}, Settings {var.effect!r}"
        default = fields[var.field].default
        if var.field in DESCRIBED_DEFAULTS:
            continue
        if default is None:
            assert default_cell.startswith("unset"), f"{var.env}: default is unset, README says {default_cell!r}"
        elif isinstance(default, bool):
            assert f"`{int(default)}`" in default_cell or str(default).lower() in default_cell, var.env
        elif isinstance(default, int | float):
            assert re.match(rf"{default:g}\b", default_cell), f"{var.env}: default {default:g}, README {default_cell!r}"
        else:
            assert f"`{default}`" in default_cell, f"{var.env}: default {default!r}, README {default_cell!r}"


def test_every_readme_variable_is_read_where_it_says() -> None:
    rows = readme_rows()
    settings_vars = {v.env for v in Settings.variables()}
    web = set().union(*WEB_VARIABLES.values()) | WEB_PREFIXED
    commands = set().union(*COMMAND_VARIABLES.values())
    tenure_rows = {name for name in rows if name.startswith("TENURE_")}
    assert tenure_rows - settings_vars - web - commands == set(), "README rows that nothing reads"
    assert web <= tenure_rows, "web variables missing from the README"
    assert commands <= tenure_rows, "command variables missing from the README"
    for path, names in {**WEB_VARIABLES, **COMMAND_VARIABLES}.items():
        source = (ROOT / path).read_text(encoding="utf-8")
        for name in names:
            assert name in source, f"{name} is not read in {path}"
    factory = (ROOT / "webapp/__init__.py").read_text(encoding="utf-8")
    assert 'from_prefixed_env("TENURE_WEB")' in factory
    for name in WEB_PREFIXED:
        assert f'"{name.removeprefix("TENURE_WEB_")}"' in factory, f"{name}: no such key in webapp DEFAULTS"


def test_only_the_settings_module_reads_settings_variables_from_the_environment() -> None:
    names = {v.env for v in Settings.variables()}
    offenders = []
    layers = ("broker", "settings", "accounts", "jobs", "tasks", "webapp", "monitoring", "tenure_cli")
    for path in sorted(ROOT.glob("*.py")) + sorted(p for d in layers for p in (ROOT / d).rglob("*.py")):
        if path == ROOT / "settings" / "environment.py":
            continue
        source = path.read_text(encoding="utf-8")
        for name in names:
            if re.search(rf"(environ|getenv)\S*\(?\s*[\[(]?\s*['\"]{name}['\"]", source):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []
