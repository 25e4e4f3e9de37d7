"""The daemon's log filters (issue 19): secrets masked, a descriptor flood logged once."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from keymem_daemon.logs import FLOOD_INTERVAL, RateLimitFloods, RedactTokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def flood_log() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO, Clock]]:
    """A logger with two handlers sharing one flood filter, as the daemon's file and stderr do."""
    clock = Clock()
    shared = RateLimitFloods(clock)
    streams = io.StringIO(), io.StringIO()
    logger = logging.getLogger("test_logs.flood")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handlers = [logging.StreamHandler(stream) for stream in streams]
    for handler in handlers:
        handler.addFilter(shared)
        handler.addFilter(RedactTokens())
        logger.addHandler(handler)
    yield logger, streams[0], streams[1], clock
    for handler in handlers:
        logger.removeHandler(handler)


def test_a_flood_of_too_many_open_files_is_one_line_per_interval_on_every_handler(
    flood_log: tuple[logging.Logger, io.StringIO, io.StringIO, Clock],
) -> None:
    logger, file_stream, stderr_stream, clock = flood_log
    error = OSError(24, "Too many open files")
    for _ in range(500):
        logger.error("socket.accept() out of system resource", exc_info=(OSError, error, None))
        clock.now += 0.01
    logger.warning("something else")
    clock.now += FLOOD_INTERVAL
    logger.error("socket.accept() out of system resource", exc_info=(OSError, error, None))
    for stream in (file_stream, stderr_stream):
        lines = stream.getvalue().splitlines()
        assert len(lines) == 3, lines
        assert "Too many open files" in lines[0] and "Traceback" not in stream.getvalue()
        assert lines[1] == "something else"
        assert "(499 more like it in the last 30 s not logged)" in lines[2]


def test_secret_named_query_values_are_masked_but_other_parameters_kept(
    flood_log: tuple[logging.Logger, io.StringIO, io.StringIO, Clock],
) -> None:
    logger, stream, _, _ = flood_log
    logger.info('%s - "GET %s HTTP/1.1" 200', "127.0.0.1:5", "/v1/stats?access_token=T1&limit=5&Password=P2;sig=S3")
    logger.info("Authorization: Bearer abc.def")
    text = stream.getvalue()
    assert "T1" not in text and "P2" not in text and "S3" not in text and "abc.def" not in text
    assert "access_token=[redacted]&limit=5&Password=[redacted];sig=[redacted]" in text
