"""Settings: one table of variables, each with a default that parses and a clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keymem_daemon import config
from keymem_daemon.config import VARIABLES, Settings, Variable
from keymem_daemon.errors import ConfigError

# Defaults shown as a description rather than a value: they depend on the machine or on
# another setting, and the Settings field holds None or a computed value.
DESCRIBED = re.compile(r"^[(<]|\(|^~")
GARBAGE = "not-a-value!"


def _literal(var: Variable) -> bool:
    return not DESCRIBED.search(var.default)


def test_every_variable_names_a_settings_field_once() -> None:
    fields = set(Settings.__dataclass_fields__)
    assert len({v.env for v in VARIABLES}) == len(VARIABLES)
    assert len({v.field for v in VARIABLES}) == len(VARIABLES)
    for var in VARIABLES:
        assert var.env.startswith("KEYMEM_") and var.field in fields, var.env
        assert var.help.endswith("."), var.env


@pytest.mark.parametrize("var", [v for v in VARIABLES if _literal(v)], ids=lambda v: v.env)
def test_every_literal_default_parses_to_the_field_default(var: Variable, tmp_path: Path) -> None:
    parsed = var.parse(var.env, var.default)
    built = Settings.from_env({"HOME": str(tmp_path)})
    assert parsed == getattr(built, var.field), var.env
    assert Settings.from_env({"HOME": str(tmp_path), var.env: var.default}) == built


@pytest.mark.parametrize("var", [v for v in VARIABLES if not _literal(v)], ids=lambda v: v.env)
def test_every_described_default_is_computed(var: Variable, tmp_path: Path) -> None:
    built = Settings.from_env({"HOME": str(tmp_path)})
    value = getattr(built, var.field)
    if var.field == "data_dir":
        assert value == (tmp_path / ".keymem").resolve()
    elif var.field.endswith("threads"):
        assert isinstance(value, int) and 1 <= value <= 4
    else:
        assert value in (None, ""), var.env


@pytest.mark.parametrize("var", VARIABLES, ids=lambda v: v.env)
def test_a_bad_value_names_the_variable_and_the_value(var: Variable) -> None:
    try:
        var.parse(var.env, GARBAGE)
    except ConfigError as exc:
        assert var.env in exc.message and GARBAGE in exc.message
        with pytest.raises(ConfigError, match=var.env):
            Settings.from_env({"HOME": "/nonexistent", var.env: GARBAGE})
    else:
        assert var.parse in (config._text, config._path), f"{var.env} accepted {GARBAGE!r}"


@pytest.mark.parametrize(
    "env, raw",
    [
        ("KEYMEM_PORT", "70000"),
        ("KEYMEM_PORT", "-1"),
        ("KEYMEM_BACKUP_KEEP", "0"),
        ("KEYMEM_CLEANUP_INTERVAL", "-5"),
        ("KEYMEM_IDLE_EXIT", "inf"),
        ("KEYMEM_KEY_MERGE", "1.5"),
        ("KEYMEM_KEY_MERGE", "nan"),
        ("KEYMEM_MAX_BODY_BYTES", "12"),
        ("KEYMEM_AUTOKEY", "maybe"),
    ],
)
def test_out_of_range_values_are_refused(env: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=env):
        Settings.from_env({"HOME": "/nonexistent", env: raw})


@pytest.mark.parametrize(
    "raw, seconds",
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("2d", 172800),
        ("0", 0),
        (" 1.5h ", 5400),
    ],
)
def test_durations_take_units(raw: str, seconds: float) -> None:
    assert config.parse_duration("KEYMEM_IDLE_EXIT", raw) == seconds


def test_blank_values_mean_the_default(tmp_path: Path) -> None:
    assert Settings.from_env({"HOME": str(tmp_path), "KEYMEM_PORT": "  "}).port == 0


def test_cli_overrides_win_over_the_environment(tmp_path: Path) -> None:
    settings = Settings.from_env({"HOME": str(tmp_path), "KEYMEM_PORT": "8000"}, port=9000, log_level=None)
    assert settings.port == 9000 and settings.log_level == "info"


def test_derived_paths_live_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings.from_env({"HOME": str(tmp_path), "KEYMEM_DATA_DIR": str(tmp_path / "d")})
    root = tmp_path / "d"
    assert settings.info_path == root / "daemon.json" and settings.lock_path == root / "daemon.lock"
    assert settings.log_path == root / "logs" / "daemon.log" and settings.backup_dir == root / "backups"
    assert settings.db_path == root / "keymem.db"


def test_only_config_reads_keymem_variables() -> None:
    package = Path(config.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if path.name == "config.py":
            continue
        text = path.read_text()
        if re.search(r"""(environ|getenv)\s*(\.get)?\s*[\[(]\s*["']KEYMEM_""", text):
            offenders.append(str(path.relative_to(package)))
    assert not offenders, f"KEYMEM_* read outside config.py: {offenders}"


@pytest.mark.parametrize(
    "url, shown, described",
    [
        ("postgresql://alice:s3cr%40t@db.example:6543/team", "postgresql://alice:***@db.example:6543/team",
         "postgresql db.example:6543/team as alice"),
        ("postgresql://alice@db/team?sslmode=require&password=s3cr%40t",
         "postgresql://alice@db/team?sslmode=require&password=***", "postgresql db:5432/team as alice"),
        ("postgres:///team?host=/run/pg&port=5433", "postgres:///team?host=/run/pg&port=5433",
         "postgresql /run/pg:5433/team as the default role"),
    ],
)
def test_a_store_url_is_shown_and_described_without_its_password(url: str, shown: str, described: str) -> None:
    settings = Settings.from_env({"HOME": "/nonexistent", "KEYMEM_STORE_URL": url})
    assert settings.store_url == url
    assert config.redacted_url(url) == shown
    assert settings.store_description == described
    assert "s3cr" not in repr(settings)


@pytest.mark.parametrize(
    "url, problem",
    [("mysql://alice@db/team", "must be a postgresql:// URL"), ("postgresql://alice:pw@db/", "names no database"),
     ("postgresql://alice:pw@db:99999/team", "not a valid URL")],
)
def test_a_bad_store_url_is_refused_without_showing_its_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as refused:
        Settings.from_env({"HOME": "/nonexistent", "KEYMEM_STORE_URL": url})
    assert ":pw@" not in refused.value.message and "KEYMEM_STORE_URL" in refused.value.message


def test_without_a_store_url_the_store_is_the_sqlite_file(tmp_path: Path) -> None:
    settings = Settings.from_env({"HOME": str(tmp_path)})
    assert settings.store_url is None
    assert settings.store_description == f"sqlite {settings.db_path}"
