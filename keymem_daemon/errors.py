"""The one exception tree of keymem, and the HTTP status each error maps to.

    KeymemError                 500 internal      (base; anything unexpected)
    ├── InvalidInput            422 invalid_input  bad tool arguments or request body
    ├── NotFound                404 not_found      unknown memory, key, tool, prompt or route
    ├── Refused                 422 refused        well-formed, but the memory model refuses it
    │                                              (a tool call reports it as a normal result)
    ├── Conflict                409 conflict       the request contradicts the store's state
    │   └── IdempotencyKeyReused 409 idempotency_key_reused  the key came with another request
    ├── Unauthorized            401 unauthorized   missing or wrong bearer token
    ├── ForbiddenOrigin         403 forbidden      foreign Host header or any Origin header
    ├── PayloadTooLarge         413 too_large      request body over KEYMEM_MAX_BODY_BYTES
    ├── UnsupportedMediaType    415 unsupported_media_type  a request body that is not JSON
    ├── NotReady                503 not_ready      models or store still loading
    ├── StoreError              500 store_error    the database refused (corrupt, newer schema)
    │   └── StoreUnavailable    500 store_unavailable  the shared store's server does not answer
    ├── StoreBusy               503 store_busy     every connection to the shared store is in use
    ├── ModelError              503 model_error    a model could not be loaded or fetched
    ├── ConfigError             500 config_error   a KEYMEM_* variable has a bad value
    └── DaemonNotRunning        503 daemon_down    client side: no live daemon for this data dir

``http/app.py`` renders every one of them as ``{"error": {"code", "message"}}`` with ``status``.
"""

from __future__ import annotations

from typing import ClassVar


class KeymemError(Exception):
    """Base of every error keymem raises on purpose."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(KeymemError):
    """An argument or body field is missing, of the wrong type or out of range."""

    status = 422
    code = "invalid_input"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotFound(KeymemError):
    """The named memory, key, tool, prompt or route does not exist (or is not visible)."""

    status = 404
    code = "not_found"


class Refused(KeymemError):
    """A well-formed request the memory model declines (a keyless memory, a superseded id).

    Tool calls report it as a normal result with an ``error`` field, so the agent repairs
    the call; faults (``InvalidInput``) are reported with ``is_error``.
    """

    status = 422
    code = "refused"


class Conflict(KeymemError):
    """The request cannot apply to the store as it is now."""

    status = 409
    code = "conflict"


class IdempotencyKeyReused(Conflict):
    """An ``Idempotency-Key`` already used for a different request (another tool or other
    arguments): replaying the first answer would silently drop this one, so it is refused."""

    code = "idempotency_key_reused"


class Unauthorized(KeymemError):
    """The bearer token is missing or wrong."""

    status = 401
    code = "unauthorized"


class ForbiddenOrigin(KeymemError):
    """The request came through a foreign Host name or from a browser page (Origin)."""

    status = 403
    code = "forbidden"


class PayloadTooLarge(KeymemError):
    """The request body is larger than the daemon accepts."""

    status = 413
    code = "too_large"


class UnsupportedMediaType(KeymemError):
    """A request body that is not JSON (a browser form post, text/plain)."""

    status = 415
    code = "unsupported_media_type"


class NotReady(KeymemError):
    """The daemon is still loading its store or models."""

    status = 503
    code = "not_ready"


class StoreError(KeymemError):
    """The SQLite store cannot be used as it is (corrupt, or written by a newer keymem)."""

    status = 500
    code = "store_error"


class StoreUnavailable(StoreError):
    """The PostgreSQL server of a shared store does not answer (stopped, unreachable): nothing
    was written; reads are served from the daemon's local replica where it has one."""

    code = "store_unavailable"


class StoreBusy(KeymemError):
    """Every connection of the daemon to a shared store's server stayed in use by its other
    requests for as long as a request may wait: the server answers and the store is not
    stale (no ``StoreError``: nothing is wrong with it); nothing was done, try again."""

    status = 503
    code = "store_busy"


class ModelError(KeymemError):
    """A model could not be loaded, fetched or run."""

    status = 503
    code = "model_error"


class ConfigError(KeymemError):
    """A configuration variable has a value keymem cannot use."""

    status = 500
    code = "config_error"


class DaemonNotRunning(KeymemError):
    """No live daemon answers for this data directory (client side)."""

    status = 503
    code = "daemon_down"
