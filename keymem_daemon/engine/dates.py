"""Dates and periods named in a query: "on 8 May 2023", "last November", "in 2022",
"2023년 5월 8일", "작년", "지난주" ... -> the UTC window they denote.

Memories carry when they were observed; a query that names a time prefers memories
observed inside that window. Relative expressions are resolved against the caller's clock.
Only expressions that name a period are recognised -- a bare number is never a year unless
it sits next to "in"/"during"/"of"/"년" or a month.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Final

_MONTHS: Final = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d{2})"
_WEEKDAYS: Final = {name.lower(): i for i, name in enumerate(calendar.day_name)}

_PATTERNS: Final = (
    ("day", re.compile(rf"\b{_YEAR}-(?P<m>\d{{1,2}})-(?P<d>\d{{1,2}})\b")),
    ("day", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.I)),
    ("day", re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.I)),
    ("day", re.compile(rf"{_YEAR}\s*년\s*(?P<m>\d{{1,2}})\s*월\s*(?P<d>\d{{1,2}})\s*일")),
    ("month", re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b", re.I)),
    ("month", re.compile(rf"{_YEAR}\s*년\s*(?P<m>\d{{1,2}})\s*월")),
    ("year", re.compile(rf"\b(?:in|during|of|since|throughout)\s+{_YEAR}\b", re.I)),
    ("year", re.compile(rf"{_YEAR}\s*년")),
)
_DAY_NO_YEAR: Final = (
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b", re.I),
    re.compile(rf"\b{_MONTH}\s+{_DAY}\b", re.I),
    re.compile(r"(?P<m>\d{1,2})\s*월\s*(?P<d>\d{1,2})\s*일"),
)
_LAST_MONTH_NAME: Final = re.compile(rf"\b(?:last|past|this|previous)\s+{_MONTH}\b", re.I)
_KO_MONTH_REL: Final = re.compile(r"(?P<rel>작년|올해|지난해|지난)\s*(?P<m>\d{1,2})\s*월")
_AGO: Final = re.compile(r"\b(?P<n>\d+|a|an|one|two|three|four|five|six)\s+(?P<unit>day|week|month|year)s?\s+ago\b",
                         re.I)
_KO_AGO: Final = re.compile(r"(?P<n>\d+)\s*(?P<unit>일|주|달|개월|년)\s*전")
_WORDS: Final = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open UTC interval [start, end) in epoch seconds, and the text that named it."""

    start: float
    end: float
    phrase: str

    def contains(self, ts: float) -> bool:
        return self.start <= ts < self.end


def _utc(year: int, month: int = 1, day: int = 1) -> datetime:
    return datetime(year, month, day, tzinfo=timezone.utc)


def _month_window(year: int, month: int, phrase: str) -> Window:
    start = _utc(year, month)
    end = _utc(year + 1, 1) if month == 12 else _utc(year, month + 1)
    return Window(start.timestamp(), end.timestamp(), phrase)


def _day_window(year: int, month: int, day: int, phrase: str) -> Window | None:
    try:
        start = _utc(year, month, day)
    except ValueError:
        return None
    return Window(start.timestamp(), (start + timedelta(days=1)).timestamp(), phrase)


def _span(start: datetime, end: datetime, phrase: str) -> Window:
    return Window(start.timestamp(), end.timestamp(), phrase)


def _month_of(match: re.Match[str]) -> int:
    if match.groupdict().get("m"):
        return int(match.group("m"))
    return _MONTHS[match.group("month").lower().rstrip(".")]


def find_window(query: str, now: float) -> Window | None:
    """The first date or period ``query`` names, or None."""
    today = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    for kind, pattern in _PATTERNS:
        match = pattern.search(query)
        if match is None:
            continue
        year = int(match.group("year"))
        if kind == "year":
            return _span(_utc(year), _utc(year + 1), match.group())
        month = _month_of(match)
        if not 1 <= month <= 12:
            continue
        if kind == "month":
            return _month_window(year, month, match.group())
        day = int(match.groupdict().get("d") or match.group("day"))
        window = _day_window(year, month, day, match.group())
        if window is not None:
            return window
    for pattern in _DAY_NO_YEAR:
        match = pattern.search(query)
        if match is not None:
            month = _month_of(match)
            day = int(match.groupdict().get("d") or match.group("day"))
            if 1 <= month <= 12:
                year = today.year if (month, day) <= (today.month, today.day) else today.year - 1
                window = _day_window(year, month, day, match.group())
                if window is not None:
                    return window
    return _relative_window(query, today)


def _relative_window(query: str, today: datetime) -> Window | None:
    lowered = query.lower()
    match = _LAST_MONTH_NAME.search(query)
    if match is not None:
        month = _month_of(match)
        this = match.group().lower().startswith("this")
        year = today.year if this or month < today.month else today.year - 1
        return _month_window(year, month, match.group())
    match = _KO_MONTH_REL.search(query)
    if match is not None:
        month = int(match.group("m"))
        if 1 <= month <= 12:
            rel = match.group("rel")
            if rel in ("작년", "지난해"):
                year = today.year - 1
            elif rel == "올해":
                year = today.year
            else:
                year = today.year if month < today.month else today.year - 1
            return _month_window(year, month, match.group())
    match = _AGO.search(query) or _KO_AGO.search(query)
    if match is not None:
        raw = match.group("n").lower()
        n = _WORDS.get(raw) or int(raw)
        unit = match.group("unit").lower()
        days = {"day": 1, "일": 1, "week": 7, "주": 7, "month": 30, "달": 30, "개월": 30, "year": 365, "년": 365}[unit]
        center = today - timedelta(days=n * days)
        slack = timedelta(days=max(1, n * days // 4))
        return _span(center - slack, center + slack + timedelta(days=1), match.group())
    table: tuple[tuple[tuple[str, ...], datetime, datetime], ...] = (
        (("yesterday", "어제"), today - timedelta(days=1), today),
        (("today", "오늘"), today, today + timedelta(days=1)),
        (("그제", "그저께"), today - timedelta(days=2), today - timedelta(days=1)),
        (("last week", "지난주", "지난 주"), today - timedelta(days=today.weekday() + 7),
         today - timedelta(days=today.weekday())),
        (("this week", "이번 주", "이번주"), today - timedelta(days=today.weekday()), today + timedelta(days=1)),
        (("last month", "지난달", "지난 달"),
         (today.replace(day=1) - timedelta(days=1)).replace(day=1), today.replace(day=1)),
        (("this month", "이번 달", "이번달"), today.replace(day=1), today + timedelta(days=1)),
        (("last year", "작년", "지난해"), _utc(today.year - 1), _utc(today.year)),
        (("this year", "올해"), _utc(today.year), _utc(today.year + 1)),
    )
    for phrases, start, end in table:
        for phrase in phrases:
            if phrase in lowered:
                return _span(start, end, phrase)
    for name, weekday in _WEEKDAYS.items():
        if f"last {name}" in lowered:
            back = (today.weekday() - weekday) % 7 or 7
            day = today - timedelta(days=back)
            return _span(day, day + timedelta(days=1), f"last {name}")
    return None
