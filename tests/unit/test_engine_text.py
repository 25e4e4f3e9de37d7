"""Text: one normalisation everywhere, Kiwi morphemes so Korean particles never fuse with
nouns, NFD input behaving like NFC, and an FTS5 lexical index that follows every write."""

from __future__ import annotations

import unicodedata

import pytest
from engine_helpers import db_read, key_id, remember

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads.channels import lexical
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.reads.recall import recall
from keymem_daemon.engine.text import Analyzer, normalize, normalize_namespace, sound_skeleton

pytestmark = pytest.mark.timeout(60)


def lexical_ids(graph: MemoryGraph, query: str) -> list[str]:
    tokens = graph.analyzer.index_tokens(query)
    now = graph.clock()
    return [mid for mid, _ in graph.store.read(lambda c: lexical(c, tokens, None, now))]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("ＡＢＣ", "abc"),  # NFKC folds full-width forms
        ("Straße", "strasse"),  # casefold, not lower
        ("  many \t spaces\n here  ", "many spaces here"),
        ("ﬁle", "file"),  # compatibility ligature
        ("PYTHON", "python"),
    ],
)
def test_normalize_is_nfkc_casefold_and_collapsed_whitespace(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_nfd_korean_normalizes_to_the_same_text_as_nfc() -> None:
    text = "배포를 언제 했지?"
    assert unicodedata.normalize("NFD", text) != text
    assert normalize(unicodedata.normalize("NFD", text)) == normalize(text)


def test_namespaces_use_the_same_normalisation() -> None:
    assert normalize_namespace("  Work  Project ") == "work project"
    assert normalize_namespace("") == "default"
    assert normalize_namespace(None) == "default"


@pytest.mark.parametrize("eojeol", ["배포를", "배포가", "배포했다", "배포는", "배포"])
def test_a_korean_particle_or_ending_never_fuses_with_its_noun(
    analyzer: Analyzer, eojeol: str
) -> None:  # noqa: F811
    assert analyzer.index_tokens(eojeol) == ["배포"]


def test_a_korean_compound_keeps_its_nouns_as_subwords(analyzer: Analyzer) -> None:  # noqa: F811
    tokens = analyzer.index_tokens("코드리뷰를 했다")
    assert {"코드리뷰", "코드", "리뷰"} <= set(tokens)


def test_a_derived_korean_word_is_embedded_whole_and_compared_by_its_stem(analyzer: Analyzer) -> None:  # noqa: F811
    # 초기화 ("reset") is 초기 ("early stage") + the suffix 화: the index keeps the stem, so
    # 초기화했다 and 초기화돼 still meet, but the word a query embeds is the one it says.
    words = [w for w in analyzer.analyze("데이터는 언제 초기화돼?") if w.stem == "초기"]
    assert [w.surface for w in words] == ["초기화"]
    assert analyzer.index_tokens("초기화했다") == analyzer.index_tokens("초기화돼") == ["초기"]
    # Respect and number make no other word: a name keeps its sound (마커스 and Marcus).
    assert [w.surface for w in analyzer.analyze("마커스님은 개발자들과")] == ["마커스", "개발자"]


def test_a_korean_name_stays_one_word_whatever_its_particle(analyzer: Analyzer) -> None:  # noqa: F811
    # Kiwi's default dictionary of proper nouns split 김서연 into 김/서/연; keymem does not load it.
    assert analyzer.index_tokens("김서연은") == analyzer.index_tokens("김서연에게") == ["김서연"]


def test_latin_words_are_a_texts_english_words_as_written(analyzer: Analyzer) -> None:  # noqa: F811
    # What a Korean prompt's words are compared with (retrieval's cross-script coverage): surface
    # forms, not stems, no stopwords, nothing with a digit, no Hangul -- and no Kiwi involved.
    text = "결제 서비스 v2를 금요일에 배포했다. Deploy worker12 to the APIs, then deploy again"
    assert analyzer.latin_words(text) == ("deploy", "apis")


@pytest.mark.parametrize(("hangul", "latin"), [
    ("아틀라스", "atlas"), ("스테이징", "staging"), ("브랜치", "branch"), ("프론트엔드", "frontend"),
    ("디버깅", "debugging"), ("커버리지", "coverage"), ("서비스", "service"), ("파이썬", "python"),
    ("로봇", "robot"), ("쿠버네티스", "kubernetes"), ("헬름", "helm"), ("도윤", "doyun"), ("머지", "merge"),
])
def test_a_loanword_or_name_sounds_the_same_in_both_scripts(hangul: str, latin: str) -> None:
    assert sound_skeleton(hangul) == sound_skeleton(latin) != ""


@pytest.mark.parametrize(("a", "b"), [("스택", "staging"), ("아틀라스", "meridian"), ("자리", "hiring")])
def test_different_words_have_different_sound_skeletons(a: str, b: str) -> None:
    assert sound_skeleton(a) != sound_skeleton(b)


def test_only_hangul_and_latin_letters_have_a_sound_skeleton() -> None:
    assert sound_skeleton("東京") == sound_skeleton("2024") == ""
    # A native word can share a loanword's skeleton (다음 "next", team: TM), which is why
    # retrieval also asks the embedder for some kinship before it treats them as one word.
    assert sound_skeleton("다음") == sound_skeleton("team")


def test_latin_words_are_stemmed_so_inflections_meet(analyzer: Analyzer) -> None:  # noqa: F811
    assert (
        analyzer.index_tokens("deployments")
        == analyzer.index_tokens("deployed")
        == analyzer.index_tokens("deploy")
    )


def test_nfd_korean_text_is_analysed_like_nfc(analyzer: Analyzer) -> None:  # noqa: F811
    text = "결제 서비스를 배포했다"
    assert analyzer.index_tokens(unicodedata.normalize("NFD", text)) == analyzer.index_tokens(text)


def test_a_memory_keyed_배포_is_found_by_a_question_with_a_particle(graph: MemoryGraph) -> None:
    mid = remember(
        graph, "결제 서비스 v2.4.0은 2023년 5월 8일에 배포했다.", ["배포", "결제 서비스", "릴리스"]
    )
    deploy = key_id(graph, "배포")
    found = recall(graph, "배포를 언제 했지?")
    assert found.status == "found"
    assert found.keys[0].key_id == deploy
    assert found.keys[0].match_type == "concept"
    assert found.memories[0].id == mid
    hits = hybrid_recall(graph, "배포를 언제 했지?", reinforce=False).hits
    assert hits and hits[0].id == mid
    assert "배포" in hits[0].matched_via


def test_a_memory_remembered_in_nfd_is_found_by_an_nfc_query_and_back(graph: MemoryGraph) -> None:
    nfd = unicodedata.normalize("NFD", "고양이 이름은 나비다")
    cat = remember(graph, nfd, [unicodedata.normalize("NFD", "고양이"), "cat"])
    dog = remember(graph, "강아지 이름은 초코다", ["강아지", "dog"])
    assert key_id(graph, "고양이") == key_id(graph, unicodedata.normalize("NFD", "고양이"))
    for query in ("고양이 이름이 뭐야?", unicodedata.normalize("NFD", "고양이 이름이 뭐야?")):
        found = recall(graph, query)
        assert found.memories[0].id == cat, query
        assert lexical_ids(graph, query)[0] == cat
    assert lexical_ids(graph, unicodedata.normalize("NFD", "강아지는?"))[0] == dog


def test_the_same_text_in_nfd_and_nfc_is_one_memory(graph: MemoryGraph) -> None:
    text = "우리 팀은 금요일에 배포한다"
    first = remember(graph, text, ["배포", "금요일"])
    second = remember(graph, unicodedata.normalize("NFD", text), ["배포", "금요일"])
    assert first == second
    assert graph.stats().memories == 1


def test_a_key_given_in_another_case_or_spacing_is_the_same_key(graph: MemoryGraph) -> None:
    remember(graph, "Code review happens on Tuesdays", ["Code Review", "schedule"])
    remember(graph, "Code review needs two approvals", ["  code   REVIEW ", "approval"])
    concepts = [k.concept for k in graph.keys.all()]
    assert sum(1 for c in concepts if normalize(c) == "code review") == 1
    assert len(graph.read_key(key_id(graph, "code review")).memories) == 2


def test_a_remembered_memory_is_found_lexically_at_once(graph: MemoryGraph) -> None:
    assert lexical_ids(graph, "flamingo") == []
    mid = remember(graph, "A flamingo stands on one leg", ["bird", "posture"])
    assert lexical_ids(graph, "flamingo") == [mid]
    # Key text is indexed too.
    assert lexical_ids(graph, "posture") == [mid]


def test_a_forgotten_memory_leaves_the_lexical_index(graph: MemoryGraph) -> None:
    mid = remember(graph, "A flamingo stands on one leg", ["bird", "posture"])
    graph.forget(mid)
    assert lexical_ids(graph, "flamingo") == []
    assert (
        db_read(graph.store, lambda c: c.execute("SELECT COUNT(*) FROM memory_fts").fetchone()[0]) == 0
    )


def test_a_corrected_memory_leaves_the_lexical_index_and_its_correction_enters_it(
    graph: MemoryGraph,
) -> None:
    old = remember(graph, "The office coffee machine is a Jura", ["coffee", "office"])
    fixed = graph.correct(
        old,
        graph.prepare(
            content="The office coffee machine is a Breville", keys=None, require_keys=False
        ),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    new = fixed.new_id  # type: ignore[union-attr]
    assert lexical_ids(graph, "Jura") == []
    assert lexical_ids(graph, "Breville") == [new]
    assert lexical_ids(graph, "coffee machine") == [new]


def test_forgetting_a_correction_puts_its_predecessor_back_in_the_lexical_index(
    graph: MemoryGraph,
) -> None:
    old = remember(graph, "The office coffee machine is a Jura", ["coffee", "office"])
    fixed = graph.correct(
        old,
        graph.prepare(
            content="The office coffee machine is a Breville", keys=None, require_keys=False
        ),
        keys_given=False,
        related_given=False,
        ttl_given=False,
        decay_given=False,
    )
    graph.forget(fixed.new_id)  # type: ignore[union-attr]
    assert lexical_ids(graph, "Jura") == [old]
    assert lexical_ids(graph, "Breville") == []


def test_a_korean_memory_is_found_lexically_whatever_the_particle(graph: MemoryGraph) -> None:
    mid = remember(graph, "배포는 매주 금요일 오후에 한다", ["일정", "schedule"])
    for query in ("배포를", "배포가 언제야", "배포했던 날"):
        assert lexical_ids(graph, query) == [mid], query
