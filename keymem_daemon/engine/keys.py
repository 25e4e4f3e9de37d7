"""Keys: sanitising what the agent passes, the in-memory key index, and the merge rules.

A key is a short concept (matched by similarity), or a ``name``/``proper_noun`` (matched
only literally, so ``동건`` never reaches ``뉴턴``). Writing a key reuses an existing one when
its normalised text equals a key's concept or alias; a concept key also joins an existing
concept key that is close enough -- within one script at the same-script threshold, across
Hangul/Latin at the (lower) cross-script threshold, because translations sit lower than
synonyms in a multilingual space while cross-script neighbours are rarely distinct concepts.
Keys that differ only in a final qualifier (``Agent A`` / ``Agent B``, ``v1`` / ``v2``) never
merge, whatever their cosine.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from keymem_daemon.engine.text import is_short_concept, is_single_cjk, normalize, script_of, strip_invisible
from keymem_daemon.engine.vectors import Snapshot, VectorTable
from keymem_daemon.errors import InvalidInput
from keymem_daemon.inference.embedders import ThresholdProfile

KeyType = Literal["concept", "name", "proper_noun"]
KEY_TYPES: Final[tuple[KeyType, ...]] = ("concept", "name", "proper_noun")
ENTITY_TYPES: Final = frozenset({"name", "proper_noun"})

MAX_KEY_CHARS: Final = 100
MAX_KEYS: Final = 12
PHRASE_TOKENS: Final = 3

_QUALIFIER = re.compile(r"^(?:[a-z]|\d+|[ivx]{1,4})$")
_PIECE = re.compile(r"\d+|[^\W\d_]+")
_SCRIPT_RUN = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]+|[^\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]+")
# Closed series whose members embed close together but are never the same thing.
_CALENDAR: Final = {
    **{name: f"weekday{i}" for i, names in enumerate((
        ("monday", "mon", "월요일"), ("tuesday", "tue", "tues", "화요일"), ("wednesday", "wed", "수요일"),
        ("thursday", "thu", "thurs", "목요일"), ("friday", "fri", "금요일"), ("saturday", "sat", "토요일"),
        ("sunday", "sun", "일요일"))) for name in names},
    **{name: f"month{i}" for i, names in enumerate((
        ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
        ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
        ("october", "oct"), ("november", "nov"), ("december", "dec")), start=1) for name in names},
}


def cross_script(a: str, b: str) -> bool:
    return {script_of(a), script_of(b)} == {"hangul", "latin"}


def _pieces(text: str) -> list[str]:
    """Digit runs and letter runs (split where Hangul meets Latin): ``1팀`` -> 1, 팀."""
    out: list[str] = []
    for run in _PIECE.findall(normalize(text)):
        out.extend(_SCRIPT_RUN.findall(run) if not run.isdigit() else [run])
    return out


def _calendar_slot(text: str) -> str | None:
    return _CALENDAR.get(normalize(text).replace(" ", ""))


def conflicting_qualifiers(a: str, b: str) -> bool:
    """Keys that name different members of one series never merge, whatever their cosine:
    ``Agent A``/``Agent B``, ``v1``/``v2``, ``1팀``/``2팀``, ``Q3``/``Q4``, and different
    weekdays or months in either language (``Monday``/``화요일``)."""
    slot_a, slot_b = _calendar_slot(a), _calendar_slot(b)
    if slot_a is not None and slot_b is not None:
        return slot_a != slot_b
    pa, pb = _pieces(a), _pieces(b)
    if len(pa) != len(pb) or pa == pb:
        return False
    differing = [(x, y) for x, y in zip(pa, pb, strict=True) if x != y]
    shared = len(pa) - len(differing)
    return shared >= 1 and all(_QUALIFIER.match(x) and _QUALIFIER.match(y) for x, y in differing)


@dataclass(frozen=True, slots=True)
class SanitizedKeys:
    keys: list[str]
    dropped: list[str]


def sanitize_keys(raw: object, *, field_name: str = "keys") -> SanitizedKeys:
    """The usable keys of ``raw`` (a list, a JSON array string, or one string).

    A key survives when it is at least two characters, or one Hangul/Han/Kana character
    (집, 돈, 車); keys are trimmed and deduplicated by their normalised form.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError:
                raise InvalidInput(f"{field_name} is not a valid JSON array: {text[:80]}",
                                   field=field_name) from None
        else:
            raw = [text]
    if not isinstance(raw, list):
        raise InvalidInput(f"{field_name} must be an array of strings", field=field_name)
    kept: list[str] = []
    dropped: list[str] = []
    seen: set[str] = set()
    for item in raw:
        if not isinstance(item, str):
            raise InvalidInput(f"{field_name} must contain only strings, got {item!r}", field=field_name)
        key = " ".join(item.split())
        norm = normalize(key)
        # Judged by what shows: a key of zero-width or bidi characters alone looks empty.
        shown = strip_invisible(key).strip()
        if len(key) > MAX_KEY_CHARS or not (len(shown) >= 2 or is_single_cjk(shown)):
            dropped.append(item)
            continue
        if norm in seen:
            continue
        seen.add(norm)
        kept.append(key)
    if len(kept) > MAX_KEYS:
        raise InvalidInput(f"{field_name} has {len(kept)} keys; use at most {MAX_KEYS} (3-6 is best)",
                           field=field_name)
    return SanitizedKeys(kept, dropped)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the index knows of a key without touching SQLite."""

    id: str
    concept: str
    key_type: KeyType
    compact: str
    aliases: tuple[str, ...] = ()
    alias_compacts: tuple[str, ...] = ()
    link_count: int = 0

    @property
    def is_entity(self) -> bool:
        return self.key_type in ENTITY_TYPES


@dataclass(slots=True)
class PendingKey:
    """A key created earlier in the same write transaction (not yet in the index)."""

    id: str
    concept: str
    key_type: KeyType
    vector: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class KeyMatch:
    """How a requested key resolves: an existing key (maybe via similarity) or a new one."""

    key_id: str | None
    via: Literal["exact", "similar", "new"]
    similarity: float = 1.0
    promote_to: KeyType | None = None
    add_alias: bool = False


class KeyIndex:
    """Every key's metadata, vector and literal forms, in memory; changed after commits."""

    def __init__(self, dim: int) -> None:
        # Full precision: key cosines decide merges and rankings near calibrated bars; int8
        # rows would save ~50 MB at 100k memories but cost the agent walk ~1 point (measured).
        self.vectors = VectorTable(dim)
        self._info: dict[str, KeyInfo] = {}
        self._by_norm: dict[str, str] = {}
        self._by_compact: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._info)

    def get(self, key_id: str) -> KeyInfo | None:
        return self._info.get(key_id)

    def by_norm(self, norm: str) -> str | None:
        return self._by_norm.get(norm)

    def all(self) -> list[KeyInfo]:
        return list(self._info.values())

    def snapshot(self) -> Snapshot:
        return self.vectors.snapshot()

    def literal_ids(self, candidates: Iterable[str]) -> set[str]:
        """Keys whose concept or an alias has one of these compact forms."""
        found: set[str] = set()
        for compact in candidates:
            found.update(self._by_compact.get(compact, ()))
        return found

    # -- changes (writer thread, after commit) --------------------------------------------

    def put(self, info: KeyInfo, vector: npt.NDArray[np.floating] | None = None) -> None:
        """A key as the store holds it now (a load, or the change log read after the commits
        it reports: the link count is the store's)."""
        with self._lock:
            old = self._info.get(info.id)
            if old is not None:
                self._unindex(old)
            self._index(info)
        if vector is not None:
            self.vectors.upsert(info.id, vector)

    def put_created(self, info: KeyInfo, vector: npt.NDArray[np.floating]) -> None:
        """``put`` of a key a write created, after its commit, unless the index holds it
        already: whoever put it there read it after that commit (another write that found it
        in the store, or the change log), so their link count has this write's link in it."""
        with self._lock:
            if info.id not in self._info:
                self._index(info)
        self.vectors.upsert(info.id, vector)  # (a write that found it stored had no vector)

    def put_written(self, info: KeyInfo, new_links: int, vector: npt.NDArray[np.floating] | None = None) -> None:
        """``put`` of a key as a write read it back, after its commit: a key the index holds
        keeps its link count, moved by the ``new_links`` the write made. The read saw the
        links committed before the write's snapshot, not those of a concurrent write that
        committed before it and has moved the index's count by delta already (on a shared
        store; one SQLite writer commits and applies one write at a time). ``vector``: the
        key's, when the write created it."""
        with self._lock:
            old = self._info.get(info.id)
            if old is not None:
                info = replace(info, link_count=max(0, old.link_count + new_links))
                self._unindex(old)
            self._index(info)
        if vector is not None:
            self.vectors.upsert(info.id, vector)

    def put_many(self, infos: Sequence[KeyInfo], vectors: npt.NDArray[np.float32]) -> None:
        """``put`` of many keys with their vectors (``vectors[i]`` is ``infos[i]``'s): a load."""
        for info in infos:
            self.put(info)
        self.vectors.upsert_many([info.id for info in infos], vectors, np.zeros(len(infos), dtype=np.int32))

    def remove(self, key_id: str) -> None:
        with self._lock:
            old = self._info.pop(key_id, None)
            if old is not None:
                self._unindex(old)
        self.vectors.remove(key_id)

    def add_links(self, key_id: str, delta: int) -> None:
        with self._lock:
            info = self._info.get(key_id)
            if info is not None:
                self._info[key_id] = replace(info, link_count=max(0, info.link_count + delta))

    def _index(self, info: KeyInfo) -> None:
        self._info[info.id] = info
        self._by_norm[normalize(info.concept)] = info.id
        for alias in info.aliases:
            self._by_norm.setdefault(normalize(alias), info.id)
        for compact in (info.compact, *info.alias_compacts):
            if compact:
                self._by_compact.setdefault(compact, set()).add(info.id)

    def _unindex(self, info: KeyInfo) -> None:
        for text in (info.concept, *info.aliases):
            norm = normalize(text)
            if self._by_norm.get(norm) == info.id:
                del self._by_norm[norm]
        for compact in (info.compact, *info.alias_compacts):
            ids = self._by_compact.get(compact)
            if ids is not None:
                ids.discard(info.id)
                if not ids:
                    del self._by_compact[compact]

    # -- decisions ----------------------------------------------------------------------

    def resolve(
        self,
        concept: str,
        key_type: KeyType,
        vector: npt.NDArray[np.float32],
        profile: ThresholdProfile,
        pending: Sequence[PendingKey] = (),
        neighbours: Sequence[tuple[float, str]] | None = None,
    ) -> KeyMatch:
        """Which key ``concept`` lands on (see the module docstring for the rules).
        ``neighbours``: the existing keys close to ``vector``, if the caller computed them
        for several keys at once (``neighbours_of``)."""
        norm = normalize(concept)
        for p in pending:
            if normalize(p.concept) == norm:
                return KeyMatch(p.id, "exact")
        existing = self._by_norm.get(norm)
        if existing is not None:
            info = self._info[existing]
            promote = key_type if key_type in ENTITY_TYPES and info.key_type == "concept" else None
            return KeyMatch(existing, "exact", promote_to=promote)
        if key_type in ENTITY_TYPES:
            return KeyMatch(None, "new")
        best = self._best_similar(concept, vector, profile, pending, neighbours)
        if best is not None:
            return KeyMatch(best[0], "similar", similarity=best[1], add_alias=True)
        return KeyMatch(None, "new")

    def neighbours_of(self, vectors: npt.NDArray[np.float32], profile: ThresholdProfile
                      ) -> list[list[tuple[float, str]]]:
        """For each vector, the existing keys close enough to be merge candidates (one
        matrix product for all the keys of a write)."""
        floor = min(profile.short_key_merge, profile.key_merge, profile.cross_script_merge)
        snap = self.vectors.snapshot()
        if not snap.ids:
            return [[] for _ in range(len(vectors))]
        sims = snap.similarities(vectors)
        return [[(float(row[i]), snap.ids[i]) for i in np.flatnonzero(row >= floor)] for row in sims]

    def _best_similar(
        self,
        concept: str,
        vector: npt.NDArray[np.float32],
        profile: ThresholdProfile,
        pending: Sequence[PendingKey],
        neighbours: Sequence[tuple[float, str]] | None,
    ) -> tuple[str, float] | None:
        same_at = profile.short_key_merge if is_short_concept(concept) else profile.key_merge
        if neighbours is None:
            neighbours = self.neighbours_of(vector[None, :], profile)[0]
        candidates: list[tuple[float, str, str]] = []
        for sim, kid in neighbours:
            info = self._info.get(kid)
            if info is not None and info.key_type == "concept":
                candidates.append((sim, kid, info.concept))
        for p in pending:
            if p.key_type == "concept":
                candidates.append((float(p.vector @ vector), p.id, p.concept))
        for sim, kid, other in sorted(candidates, reverse=True):
            threshold = profile.cross_script_merge if cross_script(concept, other) else same_at
            if sim >= threshold and not conflicting_qualifiers(concept, other):
                return kid, sim
        return None


@dataclass(frozen=True, slots=True)
class NearKey:
    your_key: str
    existing_concept: str
    key_id: str
    similarity: float


@dataclass(frozen=True, slots=True)
class WriteHints:
    near_keys: list[NearKey] = field(default_factory=list)
    language_note: str | None = None
    phrase_keys: list[str] | None = None
    phrase_note: str | None = None
    few_keys_note: str | None = None


LANGUAGE_NOTE: Final = (
    "All keys are in one language. Recall queries arrive in both Korean and English -- add "
    "cross-lingual variants of the main concepts (for example '배포' with 'deployment')."
)
PHRASE_NOTE: Final = (
    "These keys are phrases, not atomic concepts. Use 1-2 word concept keys (e.g. 'Nexora' and "
    "'portfolio', not 'Nexora portfolio'): phrase keys are almost never reached again."
)
FEW_KEYS_NOTE: Final = "Fewer than 3 keys: add 3-6 atomic keys so the memory can be reached."


def language_uniform(keys: Sequence[str]) -> bool:
    scripts = {script_of(k) for k in keys} - {"other"}
    return len(scripts) == 1


@dataclass(frozen=True, slots=True)
class MemberState:
    """What an active memory contributes to its keys' counts."""

    namespace: str
    keys: tuple[str, ...]
    expires_at: float | None


class ActiveCounts:
    """How many active (not superseded) memories each key has, per namespace, in memory.

    ``recall`` and ``read_memory`` show a ``memory_count`` for every key they return; counting
    a hub's links in SQLite costs milliseconds per key, this costs a dict lookup. Writers
    report each memory's state before and after a change (``apply``). Memories with an expiry
    are tracked too, so a count never includes a memory that expired but was not yet cleaned.
    """

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._expiring: dict[str, MemberState] = {}
        self._lock = threading.Lock()

    def apply(self, memory_id: str, before: MemberState | None, after: MemberState | None) -> None:
        with self._lock:
            for state, delta in ((before, -1), (after, 1)):
                if state is None:
                    continue
                for kid in state.keys:
                    by_ns = self._counts.setdefault(kid, {})
                    by_ns[state.namespace] = by_ns.get(state.namespace, 0) + delta
                    if by_ns[state.namespace] <= 0:
                        del by_ns[state.namespace]
                        if not by_ns:
                            del self._counts[kid]
            if after is not None and after.expires_at is not None:
                self._expiring[memory_id] = after
            else:
                self._expiring.pop(memory_id, None)

    def add_counts(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Load (key, namespace, active members without an expiry) rows at start."""
        with self._lock:
            self._add_rows(rows)

    def _add_rows(self, rows: Iterable[tuple[str, str, int]]) -> None:
        for kid, namespace, n in rows:
            by_ns = self._counts.setdefault(kid, {})
            by_ns[namespace] = by_ns.get(namespace, 0) + n

    def recount(self, key_ids: Iterable[str], rows: Iterable[tuple[str, str, int]],
                states: Mapping[str, MemberState | None]) -> None:
        """Count these keys again: their members without an expiry (``rows``, as
        ``add_counts`` takes them) plus the expiring members tracked here, after ``states``
        (memory -> its state now, None: no longer active) replaced the tracked ones."""
        with self._lock:
            for memory_id, state in states.items():
                if state is not None and state.expires_at is not None:
                    self._expiring[memory_id] = state
                else:
                    self._expiring.pop(memory_id, None)
            keys = set(key_ids)
            for kid in keys:
                self._counts.pop(kid, None)
            self._add_rows(rows)
            for state in self._expiring.values():
                for kid in keys.intersection(state.keys):
                    by_ns = self._counts.setdefault(kid, {})
                    by_ns[state.namespace] = by_ns.get(state.namespace, 0) + 1

    def get_many(self, key_ids: Iterable[str], namespaces: Iterable[str] | str | None,
                 now: float) -> dict[str, int]:
        """Active members of each key in these namespaces (one name, several, or None = all)."""
        scope = {namespaces} if isinstance(namespaces, str) else (None if namespaces is None else set(namespaces))
        with self._lock:
            out = {}
            for kid in key_ids:
                by_ns = self._counts.get(kid, {})
                out[kid] = sum(n for ns, n in by_ns.items() if scope is None or ns in scope)
            for state in self._expiring.values():
                if state.expires_at is not None and now > state.expires_at and \
                        (scope is None or state.namespace in scope):
                    for kid in state.keys:
                        if kid in out:
                            out[kid] -= 1
            return out
