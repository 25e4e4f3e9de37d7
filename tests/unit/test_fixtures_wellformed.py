"""The hand-written evaluation fixtures are well-formed.

Covers tests/fixtures/key_pairs.tsv (labelled key pairs for threshold calibration) and the
Korean/English retrieval set (ko_en_memories.jsonl + ko_en_queries.jsonl). Stdlib only, no network.
"""

from __future__ import annotations

import collections
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KEY_PAIRS = FIXTURES / "key_pairs.tsv"
MEMORIES = FIXTURES / "ko_en_memories.jsonl"
QUERIES = FIXTURES / "ko_en_queries.jsonl"

HANGUL = re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
LATIN = re.compile(r"[A-Za-z]")

PAIR_HEADER = ["a", "b", "label", "kind", "split"]
SAME_KINDS = {"translation", "synonym", "variant"}
DISTINCT_KINDS = {"related", "unrelated", "names", "qualifier"}
PAIR_KIND_MINIMUMS = {
    "translation": 70,
    "synonym": 30,
    "variant": 20,
    "related": 50,
    "unrelated": 20,
    "names": 20,
    "qualifier": 10,
}

CATEGORY_MINIMUMS = {
    "particle": 12,
    "compound": 12,
    "two_syllable": 12,
    "nfd": 8,
    "mixed_script": 12,
    "en_to_ko": 12,
    "ko_to_en": 12,
    "english": 20,
    "korean": 20,
    "not_found": 25,
}
KEY_TYPES = {"name", "proper_noun"}


def _has_hangul(text: str) -> bool:
    return bool(HANGUL.search(unicodedata.normalize("NFC", text)))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        assert line.strip(), f"{path.name}:{n} is blank"
        rows.append(json.loads(line))
    return rows


@pytest.fixture(scope="module")
def memories() -> list[dict[str, Any]]:
    return _read_jsonl(MEMORIES)


@pytest.fixture(scope="module")
def memories_by_id(memories: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in memories}


@pytest.fixture(scope="module")
def queries() -> list[dict[str, Any]]:
    return _read_jsonl(QUERIES)


@pytest.fixture(scope="module")
def pair_lines() -> list[str]:
    return KEY_PAIRS.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def pairs(pair_lines: list[str]) -> list[dict[str, str]]:
    body = [line for line in pair_lines if not line.startswith("#")]
    header = body[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in body[1:]]


# ---------------------------------------------------------------------------------------------
# key_pairs.tsv


def test_key_pairs_file_starts_with_a_comment_line_and_then_the_header(
    pair_lines: list[str],
) -> None:
    assert pair_lines[0].startswith("#")
    assert "\t" not in pair_lines[0]
    first_data_line = next(line for line in pair_lines if not line.startswith("#"))
    assert first_data_line.split("\t") == PAIR_HEADER


def test_every_key_pair_row_has_five_columns_and_valid_label_kind_and_split(
    pair_lines: list[str],
) -> None:
    body = [line for line in pair_lines if not line.startswith("#")][1:]
    assert body
    for line in body:
        cols = line.split("\t")
        assert len(cols) == 5, line
        a, b, label, kind, split = cols
        assert a.strip() == a and a, line
        assert b.strip() == b and b, line
        assert kind in SAME_KINDS | DISTINCT_KINDS, line
        assert label == ("same" if kind in SAME_KINDS else "distinct"), line
        assert split in {"dev", "test"}, line


def test_key_pair_kinds_meet_their_minimum_counts(pairs: list[dict[str, str]]) -> None:
    counts = collections.Counter(p["kind"] for p in pairs)
    assert len(pairs) >= 220
    for kind, minimum in PAIR_KIND_MINIMUMS.items():
        assert counts[kind] >= minimum, (kind, counts[kind])


def test_key_pairs_are_unique_and_never_pair_a_string_with_itself(
    pairs: list[dict[str, str]],
) -> None:
    seen: set[frozenset[str]] = set()
    for p in pairs:
        a, b = p["a"], p["b"]
        assert a != b, p
        pair = frozenset((a, b))
        assert pair not in seen, p
        seen.add(pair)


def test_same_labels_never_contradict_a_distinct_label(pairs: list[dict[str, str]]) -> None:
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        if p["label"] == "same":
            parent[find(p["a"].casefold())] = find(p["b"].casefold())
    for p in pairs:
        if p["label"] == "distinct":
            assert find(p["a"].casefold()) != find(p["b"].casefold()), p


def test_translation_pairs_have_exactly_one_korean_side(pairs: list[dict[str, str]]) -> None:
    for p in pairs:
        if p["kind"] == "translation":
            assert _has_hangul(p["a"]) != _has_hangul(p["b"]), p


def test_key_pairs_cover_korean_korean_and_cross_script_cases(
    pairs: list[dict[str, str]],
) -> None:
    def both_korean(p: dict[str, str]) -> bool:
        return _has_hangul(p["a"]) and _has_hangul(p["b"])

    def cross_script(p: dict[str, str]) -> bool:
        return _has_hangul(p["a"]) != _has_hangul(p["b"])

    ko_same = [p for p in pairs if both_korean(p) and p["label"] == "same"]
    ko_distinct = [p for p in pairs if both_korean(p) and p["label"] == "distinct"]
    cross_distinct = [p for p in pairs if cross_script(p) and p["label"] == "distinct"]
    assert len(ko_same) >= 15
    assert len(ko_distinct) >= 15
    assert len(cross_distinct) >= 10


def test_key_pair_splits_are_about_sixty_forty_within_each_kind(
    pairs: list[dict[str, str]],
) -> None:
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for p in pairs:
        by_kind[p["kind"]][p["split"]] += 1
    for kind, counts in by_kind.items():
        dev_share = counts["dev"] / (counts["dev"] + counts["test"])
        assert 0.5 <= dev_share <= 0.7, (kind, counts)


# ---------------------------------------------------------------------------------------------
# ko_en_memories.jsonl


def test_memory_file_has_at_least_320_memories_with_unique_ids(
    memories: list[dict[str, Any]],
) -> None:
    assert len(memories) >= 320
    ids = [m["id"] for m in memories]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"m\d{3,}", i) for i in ids)


def test_every_memory_has_the_expected_fields_and_values(
    memories: list[dict[str, Any]],
) -> None:
    for m in memories:
        assert set(m) <= {"id", "content", "keys", "key_types", "namespace", "lang"}, m["id"]
        assert isinstance(m["content"], str)
        assert 40 <= len(m["content"]) <= 300, (m["id"], len(m["content"]))
        assert m["lang"] in {"ko", "en"}, m["id"]
        assert isinstance(m["namespace"], str) and m["namespace"], m["id"]
        assert unicodedata.is_normalized("NFC", m["content"]), m["id"]


def test_every_memory_has_three_to_six_distinct_short_keys(
    memories: list[dict[str, Any]],
) -> None:
    for m in memories:
        keys = m["keys"]
        assert isinstance(keys, list), m["id"]
        assert 3 <= len(keys) <= 6, (m["id"], keys)
        assert len({k.casefold() for k in keys}) == len(keys), (m["id"], keys)
        for key in keys:
            assert isinstance(key, str) and key.strip() == key and key, (m["id"], key)
            assert len(key.split()) <= 2, (m["id"], key)
            assert unicodedata.is_normalized("NFC", key), (m["id"], key)


def test_key_types_only_name_entity_keys_of_the_same_memory(
    memories: list[dict[str, Any]],
) -> None:
    typed = 0
    for m in memories:
        key_types = m.get("key_types", {})
        assert isinstance(key_types, dict), m["id"]
        for key, kind in key_types.items():
            assert key in m["keys"], (m["id"], key)
            assert kind in KEY_TYPES, (m["id"], key, kind)
            typed += 1
    assert typed >= 20


def test_memory_language_matches_its_content(memories: list[dict[str, Any]]) -> None:
    for m in memories:
        hangul = len(HANGUL.findall(m["content"]))
        if m["lang"] == "ko":
            assert hangul >= 5, m["id"]
        else:
            letters = hangul + len(LATIN.findall(m["content"]))
            assert hangul <= 0.1 * letters, m["id"]


def test_memories_are_about_half_korean_and_half_english(memories: list[dict[str, Any]]) -> None:
    counts = collections.Counter(m["lang"] for m in memories)
    assert 0.4 <= counts["ko"] / len(memories) <= 0.6, counts


def test_memories_use_three_or_four_namespaces_with_default_the_largest(
    memories: list[dict[str, Any]],
) -> None:
    counts = collections.Counter(m["namespace"] for m in memories)
    assert 3 <= len(counts) <= 4, counts
    assert counts.most_common(1)[0][0] == "default"
    assert counts["default"] > len(memories) / 2


def test_many_memories_carry_bilingual_keys_and_some_carry_one_language_only(
    memories: list[dict[str, Any]],
) -> None:
    bilingual = korean_only = latin_only = 0
    for m in memories:
        korean_keys = [k for k in m["keys"] if _has_hangul(k)]
        if korean_keys and len(korean_keys) < len(m["keys"]):
            bilingual += 1
        elif korean_keys:
            korean_only += 1
        else:
            latin_only += 1
    assert bilingual >= 100
    assert korean_only >= 10
    assert latin_only >= 10


def test_some_keys_are_hubs_and_most_keys_are_specific(memories: list[dict[str, Any]]) -> None:
    counts = collections.Counter(k for m in memories for k in m["keys"])
    hubs = [k for k, c in counts.items() if c >= 5]
    singletons = [k for k, c in counts.items() if c == 1]
    assert len(hubs) >= 10
    assert len(singletons) > len(counts) / 2


# ---------------------------------------------------------------------------------------------
# ko_en_queries.jsonl


def test_query_file_has_at_least_170_queries_with_unique_ids(
    queries: list[dict[str, Any]],
) -> None:
    assert len(queries) >= 170
    ids = [q["id"] for q in queries]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"q\d{3,}", i) for i in ids)


def test_every_query_has_the_expected_fields_and_values(
    queries: list[dict[str, Any]], memories: list[dict[str, Any]]
) -> None:
    namespaces = {m["namespace"] for m in memories}
    fields = {"id", "query", "gold", "namespace", "category", "lang", "twin", "split"}
    for q in queries:
        assert set(q) == fields, q["id"]
        assert isinstance(q["query"], str) and q["query"].strip(), q["id"]
        assert isinstance(q["gold"], list), q["id"]
        assert len(set(q["gold"])) == len(q["gold"]), q["id"]
        assert q["namespace"] in namespaces, q["id"]
        assert q["category"] in CATEGORY_MINIMUMS, q["id"]
        assert q["lang"] in {"ko", "en"}, q["id"]
        assert q["split"] in {"dev", "test"}, q["id"]
        assert q["twin"] is None or isinstance(q["twin"], str), q["id"]


def test_query_language_matches_the_query_text(queries: list[dict[str, Any]]) -> None:
    for q in queries:
        assert _has_hangul(q["query"]) == (q["lang"] == "ko"), q["id"]


def test_each_category_meets_its_minimum_count(queries: list[dict[str, Any]]) -> None:
    counts = collections.Counter(q["category"] for q in queries)
    for category, minimum in CATEGORY_MINIMUMS.items():
        assert counts[category] >= minimum, (category, counts[category])


def test_every_gold_id_names_a_memory_in_the_query_namespace(
    queries: list[dict[str, Any]], memories_by_id: dict[str, dict[str, Any]]
) -> None:
    for q in queries:
        for gold in q["gold"]:
            assert gold in memories_by_id, (q["id"], gold)
            assert memories_by_id[gold]["namespace"] == q["namespace"], (q["id"], gold)


def test_not_found_queries_have_no_gold_and_all_other_queries_have_some(
    queries: list[dict[str, Any]],
) -> None:
    for q in queries:
        if q["category"] == "not_found":
            assert q["gold"] == [], q["id"]
        else:
            assert 1 <= len(q["gold"]) <= 3, q["id"]


def test_not_found_queries_come_in_both_languages(queries: list[dict[str, Any]]) -> None:
    langs = collections.Counter(q["lang"] for q in queries if q["category"] == "not_found")
    assert langs["ko"] >= 10
    assert langs["en"] >= 10


def test_twin_links_are_symmetric_and_their_gold_sets_are_equal(
    queries: list[dict[str, Any]],
) -> None:
    by_id = {q["id"]: q for q in queries}
    pairs = set()
    for q in queries:
        if q["twin"] is None:
            continue
        twin = by_id[q["twin"]]
        assert twin["twin"] == q["id"], q["id"]
        assert twin["id"] != q["id"], q["id"]
        assert set(twin["gold"]) == set(q["gold"]), q["id"]
        assert twin["namespace"] == q["namespace"], q["id"]
        assert {twin["lang"], q["lang"]} == {"ko", "en"}, q["id"]
        pairs.add(frozenset((q["id"], twin["id"])))
    assert len(pairs) >= 40


def test_twins_share_a_split(queries: list[dict[str, Any]]) -> None:
    by_id = {q["id"]: q for q in queries}
    for q in queries:
        if q["twin"] is not None:
            assert by_id[q["twin"]]["split"] == q["split"], q["id"]


def test_nfd_queries_are_decomposed_hangul_that_differs_from_nfc(
    queries: list[dict[str, Any]],
) -> None:
    nfd = [q for q in queries if q["category"] == "nfd"]
    assert len(nfd) >= 8
    for q in nfd:
        text = q["query"]
        assert unicodedata.is_normalized("NFD", text), q["id"]
        assert text != unicodedata.normalize("NFC", text), q["id"]
        assert q["lang"] == "ko", q["id"]


def test_queries_outside_the_nfd_category_are_nfc(queries: list[dict[str, Any]]) -> None:
    for q in queries:
        if q["category"] != "nfd":
            assert unicodedata.is_normalized("NFC", q["query"]), q["id"]


def test_cross_lingual_queries_reach_gold_in_the_other_language_through_a_bilingual_key(
    queries: list[dict[str, Any]], memories_by_id: dict[str, dict[str, Any]]
) -> None:
    for q in queries:
        if q["category"] not in {"en_to_ko", "ko_to_en"}:
            continue
        query_lang, memory_lang = ("en", "ko") if q["category"] == "en_to_ko" else ("ko", "en")
        assert q["lang"] == query_lang, q["id"]
        for gold in q["gold"]:
            memory = memories_by_id[gold]
            assert memory["lang"] == memory_lang, (q["id"], gold)
            korean_keys = [k for k in memory["keys"] if _has_hangul(k)]
            assert korean_keys, (q["id"], gold)
            assert len(korean_keys) < len(memory["keys"]), (q["id"], gold)


def test_monolingual_queries_target_memories_in_their_own_language(
    queries: list[dict[str, Any]], memories_by_id: dict[str, dict[str, Any]]
) -> None:
    expected = {"english": "en", "korean": "ko"}
    for q in queries:
        lang = expected.get(q["category"])
        if lang is None:
            continue
        assert q["lang"] == lang, q["id"]
        for gold in q["gold"]:
            assert memories_by_id[gold]["lang"] == lang, (q["id"], gold)


def test_korean_surface_form_categories_are_korean_queries(queries: list[dict[str, Any]]) -> None:
    for q in queries:
        if q["category"] in {"particle", "compound", "two_syllable", "nfd", "mixed_script"}:
            assert q["lang"] == "ko", q["id"]
        if q["category"] == "mixed_script":
            assert LATIN.search(q["query"]), q["id"]


def test_queries_are_not_copies_of_their_gold_memory_text(
    queries: list[dict[str, Any]], memories_by_id: dict[str, dict[str, Any]]
) -> None:
    for q in queries:
        text = unicodedata.normalize("NFC", q["query"]).casefold().rstrip("?.! ")
        for gold in q["gold"]:
            assert text not in memories_by_id[gold]["content"].casefold(), (q["id"], gold)


def test_query_splits_are_roughly_balanced_within_each_category(
    queries: list[dict[str, Any]],
) -> None:
    by_category: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for q in queries:
        by_category[q["category"]][q["split"]] += 1
    for category, counts in by_category.items():
        dev_share = counts["dev"] / (counts["dev"] + counts["test"])
        assert 0.4 <= dev_share <= 0.6, (category, counts)
