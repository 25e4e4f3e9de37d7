"""Dates and periods named in a query resolve to UTC windows against the caller's clock;
a bare number is never a year."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from engine_helpers import START

from keymem_daemon.engine.dates import find_window

pytestmark = pytest.mark.timeout(60)

# START is Tuesday 2023-11-14T22:13:20Z.


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("What did we ship on 8 May 2023?", "2023-05-08", "2023-05-09"),
        ("What did we ship on May 8, 2023?", "2023-05-08", "2023-05-09"),
        ("What happened on 2023-05-08?", "2023-05-08", "2023-05-09"),
        ("What did we ship in May 2023?", "2023-05-01", "2023-06-01"),
        ("What did we ship in 2022?", "2022-01-01", "2023-01-01"),
        ("Where did we go last November?", "2022-11-01", "2022-12-01"),
        ("What did we decide last March?", "2023-03-01", "2023-04-01"),
        ("2023년 5월 8일에 뭐 했지?", "2023-05-08", "2023-05-09"),
        ("2023년 5월에 뭐 했지?", "2023-05-01", "2023-06-01"),
        ("작년에 뭐 했지?", "2022-01-01", "2023-01-01"),
        ("지난주 회의 내용", "2023-11-06", "2023-11-13"),
        ("What did I say 3 days ago?", "2023-11-10", "2023-11-13"),
        ("3일 전에 뭐라고 했지?", "2023-11-10", "2023-11-13"),
        ("What happened yesterday?", "2023-11-13", "2023-11-14"),
        ("What happened last month?", "2023-10-01", "2023-11-01"),
        ("지난달 배포", "2023-10-01", "2023-11-01"),
        ("What did we do last Friday?", "2023-11-10", "2023-11-11"),
    ],
)
def test_a_named_date_or_period_resolves_to_its_window(query: str, start: str, end: str) -> None:
    window = find_window(query, START)
    assert window is not None, query
    assert (window.start, window.end) == (utc(start), utc(end))
    assert window.contains(utc(start)) and not window.contains(utc(end))
    assert window.phrase and window.phrase.lower() in query.lower()


@pytest.mark.parametrize(
    "query",
    [
        "Show me the 2023 items",
        "the number 2023",
        "I have 5 cats",
        "port 8080 is busy",
        "What is 2022 - 1999?",
        "Which deploy broke prod?",
        "",
    ],
)
def test_no_window_without_a_named_period(query: str) -> None:
    assert find_window(query, START) is None


def test_relative_periods_move_with_the_clock() -> None:
    a = find_window("작년", START)
    b = find_window("작년", utc("2025-02-01"))
    assert a is not None and b is not None
    assert (b.start, b.end) == (utc("2024-01-01"), utc("2025-01-01"))
    assert a.start != b.start


def test_an_impossible_day_never_spills_into_the_next_month() -> None:
    window = find_window("on 31 February 2023", START)
    assert window is None or (window.start, window.end) == (utc("2023-02-01"), utc("2023-03-01"))
