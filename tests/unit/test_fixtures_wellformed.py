"""The hand-written evaluation fixtures are well-formed.

Covers tests/fixtures/key_pairs.tsv (labelled key pairs for threshold calibration), the
Korean/English retrieval set (ko_en_memories.jsonl + ko_en_queries.jsonl) and the push-path set
(push_projects.jsonl + push_memories.jsonl + push_prompts.jsonl, see scripts/bench_push.py for
the format). Stdlib only, no network.
"""

from __future__ import annotations

import collections
import hashlib
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
PUSH_PROJECTS = FIXTURES / "push_projects.jsonl"
PUSH_MEMORIES = FIXTURES / "push_memories.jsonl"
PUSH_PROMPTS = FIXTURES / "push_prompts.jsonl"

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


# ---------------------------------------------------------------------------------------------
# push_projects.jsonl, push_memories.jsonl, push_prompts.jsonl (the push-path set, issue 18)
#
# One developer's store as a coding agent built it over a few weeks, and prompts as people type them.
#   push_projects.jsonl  {"namespace", "cwd", "description"}: each project's namespace and checkout
#                        directory (the bench maps cwd -> namespace in <data>/namespaces.json).
#   push_memories.jsonl  {"id": "m001", "content", "keys", "key_types", "namespace" ("default" for
#                        the person's preferences and people), "kind" (preference|fact|gotcha|person|
#                        decision), "lang" (ko|en)}
#   push_prompts.jsonl   {"id": "p001", "prompt", "cwd" (where it is typed: a project dir or /home/dev),
#                        "gold" (memory ids a thoughtful assistant would want in mind; [] = none),
#                        "kind" (see PUSH_PROMPT_KIND_MINIMUMS), "lang" (en|ko|mixed), "split" (dev|test)}

PUSH_MEMORY_KINDS = {"preference", "fact", "gotcha", "person", "decision"}
PUSH_PROMPT_KIND_MINIMUMS = {
    "task": 40,
    "error": 15,
    "stacktrace": 12,
    "code": 10,
    "paraphrase": 10,
    "person": 10,
    "cross-language": 15,
    "typo": 6,
    "general": 25,
    "near-miss": 25,
}
NO_GOLD_KINDS = {"general", "near-miss"}
"""Prompts that need no memory by construction; the others may still have none (a task nothing stored helps)."""
ALWAYS_GOLD_KINDS = {"paraphrase", "person", "cross-language", "typo"}
PUSH_SPLIT_SEED = "keymem-push-split-v1"
ISSUE_MEMORIES = {
    "m001": "The user prefers dark mode in every editor",
    "m002": "사용자는 변수 이름에 약어를 쓰지 않는 것을 선호한다",
    "m023": "Staging uses a self-signed certificate: tests must set NODE_EXTRA_CA_CERTS to certs/staging-ca.pem",
}


@pytest.fixture(scope="module")
def push_projects() -> list[dict[str, Any]]:
    return _read_jsonl(PUSH_PROJECTS)


@pytest.fixture(scope="module")
def push_memories() -> list[dict[str, Any]]:
    return _read_jsonl(PUSH_MEMORIES)


@pytest.fixture(scope="module")
def push_memories_by_id(push_memories: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in push_memories}


@pytest.fixture(scope="module")
def push_prompts() -> list[dict[str, Any]]:
    return _read_jsonl(PUSH_PROMPTS)


def _project_of(cwd: str, projects: list[dict[str, Any]]) -> str | None:
    for p in projects:
        if cwd == p["cwd"] or cwd.startswith(p["cwd"] + "/"):
            return str(p["namespace"])
    return None


def test_push_projects_are_three_or_four_with_distinct_namespaces_and_dirs(
    push_projects: list[dict[str, Any]],
) -> None:
    assert 3 <= len(push_projects) <= 4
    for p in push_projects:
        assert set(p) == {"namespace", "cwd", "description"}, p
        assert p["namespace"] != "default" and re.fullmatch(r"[a-z][a-z0-9-]*", p["namespace"]), p
        assert p["cwd"].startswith("/home/dev/src/") and not p["cwd"].endswith("/"), p
    assert len({p["namespace"] for p in push_projects}) == len(push_projects)
    assert len({p["cwd"] for p in push_projects}) == len(push_projects)


def test_push_memories_are_at_least_90_with_unique_ids_and_the_expected_fields(
    push_memories: list[dict[str, Any]], push_projects: list[dict[str, Any]]
) -> None:
    assert len(push_memories) >= 90
    ids = [m["id"] for m in push_memories]
    assert len(set(ids)) == len(ids)
    namespaces = {"default"} | {p["namespace"] for p in push_projects}
    for m in push_memories:
        assert re.fullmatch(r"m\d{3}", m["id"]), m["id"]
        assert set(m) == {"id", "content", "keys", "key_types", "namespace", "kind", "lang"}, m["id"]
        assert 25 <= len(m["content"]) <= 300, (m["id"], len(m["content"]))
        assert unicodedata.is_normalized("NFC", m["content"]), m["id"]
        assert m["namespace"] in namespaces, m["id"]
        assert m["kind"] in PUSH_MEMORY_KINDS, m["id"]
        assert m["lang"] in {"ko", "en"}, m["id"]
        assert 3 <= len(m["keys"]) <= 6, m["id"]
        assert len({k.casefold() for k in m["keys"]}) == len(m["keys"]), m["id"]
        for key in m["keys"]:
            assert isinstance(key, str) and key.strip() == key and key, (m["id"], key)
            assert len(key.split()) <= 4 and unicodedata.is_normalized("NFC", key), (m["id"], key)
        for key, kind in m["key_types"].items():
            assert key in m["keys"] and kind in KEY_TYPES, (m["id"], key)


def test_push_memories_cover_every_project_and_kind_and_are_about_forty_percent_korean(
    push_memories: list[dict[str, Any]], push_projects: list[dict[str, Any]]
) -> None:
    namespaces = collections.Counter(m["namespace"] for m in push_memories)
    for ns in {"default"} | {p["namespace"] for p in push_projects}:
        assert namespaces[ns] >= 10, (ns, namespaces)
    kinds = collections.Counter(m["kind"] for m in push_memories)
    assert all(kinds[k] >= 5 for k in PUSH_MEMORY_KINDS), kinds
    korean = sum(m["lang"] == "ko" for m in push_memories)
    assert 0.35 <= korean / len(push_memories) <= 0.5, korean
    for m in push_memories:
        hangul = len(HANGUL.findall(m["content"]))
        if m["lang"] == "ko":
            assert hangul >= 10, m["id"]
        else:
            assert hangul <= 0.1 * (hangul + len(LATIN.findall(m["content"]))), m["id"]


def test_push_memories_hold_the_issue_examples_verbatim(
    push_memories_by_id: dict[str, dict[str, Any]],
) -> None:
    for mid, content in ISSUE_MEMORIES.items():
        assert push_memories_by_id[mid]["content"] == content, mid
    assert set(push_memories_by_id["m023"]["keys"]) == {"staging", "certificate", "인증서", "TLS"}
    assert set(push_memories_by_id["m002"]["keys"]) == {"변수 이름", "naming", "abbreviation", "약어"}


def test_push_prompts_are_at_least_240_with_unique_ids_and_the_expected_fields(
    push_prompts: list[dict[str, Any]],
) -> None:
    assert len(push_prompts) >= 240
    ids = [p["id"] for p in push_prompts]
    assert len(set(ids)) == len(ids)
    for p in push_prompts:
        assert re.fullmatch(r"p\d{3}", p["id"]), p["id"]
        assert set(p) == {"id", "prompt", "cwd", "gold", "kind", "lang", "split"}, p["id"]
        assert isinstance(p["prompt"], str) and p["prompt"].strip(), p["id"]
        assert unicodedata.is_normalized("NFC", p["prompt"]), p["id"]
        assert p["cwd"] == "/home/dev" or p["cwd"].startswith("/home/dev/src/"), p["id"]
        assert p["kind"] in PUSH_PROMPT_KIND_MINIMUMS, p["id"]
        assert p["lang"] in {"en", "ko", "mixed"}, p["id"]
        assert p["split"] in {"dev", "test"}, p["id"]
        assert isinstance(p["gold"], list) and len(set(p["gold"])) == len(p["gold"]) <= 3, p["id"]


def test_push_prompt_kinds_meet_their_minimums_and_at_least_70_need_no_memory(
    push_prompts: list[dict[str, Any]],
) -> None:
    counts = collections.Counter(p["kind"] for p in push_prompts)
    for kind, minimum in PUSH_PROMPT_KIND_MINIMUMS.items():
        assert counts[kind] >= minimum, (kind, counts[kind])
    assert sum(not p["gold"] for p in push_prompts) >= 70
    for p in push_prompts:
        if p["kind"] in NO_GOLD_KINDS:
            assert p["gold"] == [], p["id"]
        if p["kind"] in ALWAYS_GOLD_KINDS:
            assert p["gold"], p["id"]


def test_push_prompt_language_matches_its_text(push_prompts: list[dict[str, Any]]) -> None:
    langs = collections.Counter(p["lang"] for p in push_prompts)
    assert langs["ko"] >= 60 and langs["mixed"] >= 10, langs
    for p in push_prompts:
        assert _has_hangul(p["prompt"]) == (p["lang"] != "en"), p["id"]
        if p["lang"] == "mixed":
            assert LATIN.search(p["prompt"]), p["id"]


def test_push_gold_ids_exist_and_are_reachable_from_the_prompts_cwd(
    push_prompts: list[dict[str, Any]],
    push_memories_by_id: dict[str, dict[str, Any]],
    push_projects: list[dict[str, Any]],
) -> None:
    for p in push_prompts:
        project = _project_of(p["cwd"], push_projects)
        for gold in p["gold"]:
            assert gold in push_memories_by_id, (p["id"], gold)
            if project is not None:
                assert push_memories_by_id[gold]["namespace"] in {"default", project}, (p["id"], gold)


def test_cross_language_push_prompts_have_gold_in_the_other_language(
    push_prompts: list[dict[str, Any]], push_memories_by_id: dict[str, dict[str, Any]]
) -> None:
    for p in push_prompts:
        if p["kind"] == "cross-language" and p["lang"] != "mixed":
            langs = {push_memories_by_id[g]["lang"] for g in p["gold"]}
            assert langs - {p["lang"]}, p["id"]


def test_push_prompts_include_long_pasted_logs_and_are_not_copies_of_gold_text(
    push_prompts: list[dict[str, Any]], push_memories_by_id: dict[str, dict[str, Any]]
) -> None:
    assert sum(len(p["prompt"]) >= 3000 for p in push_prompts) >= 8
    assert sum(p["prompt"].count("\n") >= 50 for p in push_prompts) >= 5
    for p in push_prompts:
        text = p["prompt"].casefold().rstrip("?.! ")
        for gold in p["gold"]:
            assert text not in push_memories_by_id[gold]["content"].casefold(), (p["id"], gold)


def _push_split_hash(prompt_id: str) -> str:
    return hashlib.sha256(f"{PUSH_SPLIT_SEED}:{prompt_id}".encode()).hexdigest()


def test_push_splits_follow_the_seeded_hash_rule(push_prompts: list[dict[str, Any]]) -> None:
    """The split was drawn before any tuning: within each (kind, lang, has gold) stratum, in
    sorted stratum order, prompts sorted by sha256(seed:id) alternate between the splits,
    starting with the split that is smaller so far (dev on a tie)."""
    strata: dict[tuple[str, str, bool], list[dict[str, Any]]] = collections.defaultdict(list)
    for p in push_prompts:
        strata[(p["kind"], p["lang"], bool(p["gold"]))].append(p)
    sizes: collections.Counter[str] = collections.Counter()
    for key in sorted(strata):
        order = ("test", "dev") if sizes["test"] < sizes["dev"] else ("dev", "test")
        for n, p in enumerate(sorted(strata[key], key=lambda p: _push_split_hash(p["id"]))):
            assert p["split"] == order[n % 2], p["id"]
            sizes[p["split"]] += 1


def test_both_push_splits_hold_every_kind_and_language_about_half_each(
    push_prompts: list[dict[str, Any]],
) -> None:
    for field in ("kind", "lang"):
        by_value: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for p in push_prompts:
            by_value[p[field]][p["split"]] += 1
        for value, counts in by_value.items():
            assert counts["dev"] and counts["test"], (field, value, counts)
            assert 0.4 <= counts["dev"] / (counts["dev"] + counts["test"]) <= 0.6, (field, value, counts)
    no_gold = collections.Counter(p["split"] for p in push_prompts if not p["gold"])
    assert abs(no_gold["dev"] - no_gold["test"]) <= 4, no_gold
