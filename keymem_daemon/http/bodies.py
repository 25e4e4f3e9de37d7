"""How a request body is read: strict JSON, refused with a message that names the field.

``JSONRoute`` parses a body with ``parse_json_body`` before FastAPI does, so a refusal
reaches the one error handler (``app.py``) with its own message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from keymem_daemon.errors import InvalidInput

BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
MAX_JSON_DEPTH: Final = 64
"""Deepest nesting a request body may have. Real bodies (an import's memory with its source
object) stay under ten levels; the bound keeps every later walk of a value far from Python's
recursion limit, which the parser itself hits near 1,000 levels."""
PARSE_INLINE_BYTES: Final = 1024 * 1024
"""Bodies up to this size are parsed on the event loop (a thread hop would cost more); larger
ones (imports) in a worker thread, so other requests are answered meanwhile."""
MAX_NUMBER_CHARS: Final = 100
"""Longest number literal a body may hold. No argument needs more digits; Python refuses to
read an integer of over 4,300 digits and reads long ones in quadratic time."""


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class _Refused:
    """A number literal the parser read but the body may not hold; the walk names its field."""

    what: str


def _parse_int(literal: str) -> int | _Refused:
    if len(literal) > MAX_NUMBER_CHARS:
        return _Refused(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are read")
    return int(literal)


def _parse_float(literal: str) -> float | _Refused:
    if len(literal) > MAX_NUMBER_CHARS:
        return _Refused(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are read")
    value = float(literal)
    return value if math.isfinite(value) else _Refused(f"{literal}, a number out of range; send a finite number")


def _parse_constant(name: str) -> _Refused:
    return _Refused(f"{name}, which is not JSON; send a finite number")


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, refusing with ``InvalidInput`` what keymem cannot store or
    compute with, and saying which: bytes that are not UTF-8, a syntax error (with its line and
    column), nesting past ``MAX_JSON_DEPTH``, ``NaN``/``Infinity`` or a number that overflows
    (``1e999``) or runs past ``MAX_NUMBER_CHARS``, and a lone surrogate (``\\ud800``, or raw
    CESU-8 bytes) in any string. Every refusal after the parse names the field (``arguments.top_k``).
    """
    try:
        # Raw CESU-8 surrogates decode to lone surrogates, which the walk reports with their field.
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the request body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset "
                           f"{exc.start} ({exc.reason}); send JSON encoded as UTF-8") from None
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                           f"column {exc.colno}") from None
    except RecursionError:
        raise InvalidInput("the request body is not usable JSON: it nests too deeply (the parser stops "
                           f"near 1,000 levels; keymem reads at most {MAX_JSON_DEPTH})") from None
    _check_json(value)
    return value


def _check_json(root: Any) -> None:
    """Walk a parsed body (without recursion) for what ``parse_json_body`` refuses."""
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or "the request body"
        if isinstance(value, _Refused):
            raise InvalidInput(f"{where} holds {value.what}", field=path or None)
        if isinstance(value, str):
            _check_text(value, where, path)
        elif isinstance(value, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidInput(f"{where} nests deeper than {MAX_JSON_DEPTH} levels", field=path or None)
            if isinstance(value, dict):
                for name, item in value.items():
                    inner = f"{path}.{name}" if path else name
                    _check_text(name, f"a field name in {where}", path)
                    stack.append((item, inner, depth + 1))
            else:
                stack.extend((item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value))


def _check_text(text: str, where: str, field: str) -> None:
    found = _SURROGATE.search(text)
    if found is not None:
        raise InvalidInput(f"{where} holds a lone surrogate (U+{ord(found.group()):04X} at character "
                           f"{found.start()}), which is not Unicode text; send valid UTF-8",
                           field=field or None)


class _JSONRequest(Request):
    """A request whose JSON body is read by ``parse_json_body`` (once; FastAPI reuses it)."""

    async def json(self) -> Any:
        if not hasattr(self, "_parsed_json"):
            body = await self.body()
            if len(body) > PARSE_INLINE_BYTES:  # an import: parse it off the event loop
                self._parsed_json = await anyio.to_thread.run_sync(parse_json_body, body)
            else:
                self._parsed_json = parse_json_body(body)
        return self._parsed_json


class JSONRoute(APIRoute):
    """Routes that parse their body before FastAPI does, so a refusal reaches the one error
    handler with its own message (FastAPI turns any other parse failure into "There was an
    error parsing the body")."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def parse_first(request: Request) -> Response:
            strict = _JSONRequest(request.scope, request.receive)
            if (request.method in BODY_METHODS and is_json(request.headers.get("content-type", ""))
                    and await strict.body()):
                await strict.json()
            response: Response = await handler(strict)
            return response

        return parse_first



def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json"

