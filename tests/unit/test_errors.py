"""The exception tree: every error has a status and a code, and leaves the daemon in one shape."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_api_routes import client_for, settings_for

from keymem_daemon import errors
from keymem_daemon.errors import KeymemError
from keymem_daemon.http import app as api
from keymem_daemon.service import Service

pytestmark = pytest.mark.timeout(60)


def _all_errors() -> list[type[KeymemError]]:
    found: set[type[KeymemError]] = set()
    for module in (errors, api):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, KeymemError):
                found.add(value)
    stack = list(found)
    while stack:  # subclasses defined anywhere else too
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return sorted(found, key=lambda cls: cls.__name__)


ERRORS = _all_errors()


def test_the_tree_is_documented_and_complete() -> None:
    doc = errors.__doc__ or ""
    for cls in ERRORS:
        if cls.__module__ == errors.__name__:
            assert cls.__name__ in doc, f"{cls.__name__} is missing from the tree in errors.py"
            assert f"{cls.status} {cls.code}" in " ".join(doc.split()), cls.__name__
        assert cls.__doc__, f"{cls.__name__} has no docstring"


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_has_an_http_status_and_a_code(cls: type[KeymemError]) -> None:
    assert isinstance(cls.status, int) and 400 <= cls.status <= 599
    assert isinstance(cls.code, str) and cls.code == cls.code.lower() and " " not in cls.code


def test_codes_name_one_kind_of_error_each() -> None:
    by_code: dict[str, set[int]] = {}
    for cls in ERRORS:
        by_code.setdefault(cls.code, set()).add(cls.status)
    assert all(len(statuses) == 1 for statuses in by_code.values()), by_code


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[tuple[Service, TestClient]]:
    settings = settings_for(tmp_path)
    service = Service(settings)
    with client_for(service, settings) as client:
        yield service, client


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_error_renders_through_the_handler(broken: tuple[Service, TestClient], cls: type[KeymemError]) -> None:
    service, client = broken

    def fail() -> None:
        raise cls(f"{cls.__name__} raised on purpose")

    service.stats = fail  # type: ignore[method-assign,assignment]
    response = client.get("/v1/stats")
    assert response.status_code == cls.status
    assert response.json() == {"error": {"code": cls.code, "message": f"{cls.__name__} raised on purpose"}}
