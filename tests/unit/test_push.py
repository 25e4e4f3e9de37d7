"""The push path's decision (issue 18): pure scoring and condensing, the session memory, and
``push.inject`` on a real graph (real SQLite file, real embedder, real Kiwi)."""

from __future__ import annotations

import pytest
from engine_helpers import FakeClock, remember, state

from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.reads import inject as push

# -- pure scoring -----------------------------------------------------------------------------


def reach(concept: str, weight: float, value: float, named: bool = False) -> push.KeyReach:
    return push.KeyReach(concept, weight, value, named, None if named else "term")


def evidence(**changes: object) -> push.Evidence:
    base: dict[str, object] = {
        "keys": (reach("staging", 1.0, 1.0, named=True), reach("certificate", 0.5, 0.0)),
        "terms": (("staging", 2.0, True), ("pem", 4.0, False)),
        "identifiers": (),
        "relevance": 0.2,
        "cosine": 0.3,
        "score": 1.0,
        "project": False,
        "general": False,
    }
    base.update(changes)
    return push.Evidence(**base)  # type: ignore[arg-type]


def test_key_share_weighs_each_key_by_how_specific_it_is() -> None:
    keys = [reach("staging", 1.0, 1.0, named=True), reach("certificate", 0.5, 0.0), reach("tls", 0.5, 0.5)]
    assert push.key_share(keys) == pytest.approx((1.0 + 0.25) / 2.0)
    assert push.key_share([]) == 0.0


def test_term_share_is_the_idf_weighted_share_of_the_memory_words_the_prompt_holds() -> None:
    assert push.term_share([("staging", 2.0, True), ("pem", 6.0, False)]) == pytest.approx(0.25)
    assert push.term_share([]) == 0.0


def test_features_follow_their_names_and_the_gap_to_the_rest() -> None:
    x = dict(zip(push.FEATURES, push.features(evidence(score=2.0), best=4.0, rest=0.5), strict=True))
    assert x["key_best"] == 1.0 and x["named"] == 1.0
    assert x["vs_best"] == pytest.approx(0.5)
    assert x["gap"] == pytest.approx(1 - 0.5 / 2.0)
    assert x["identifier"] == 0.0 and x["project"] == 0.0


def test_the_question_gate_keeps_todays_floor() -> None:
    x = list(push.features(evidence(), best=1.0, rest=0.0))
    relevance = push.FEATURES.index("relevance")
    x[relevance] = 0.55
    low = [0.0] * len(push.FEATURES)
    low[relevance] = 0.55
    # Whatever the task gate thinks, a memory covering more than QUESTION_FLOOR of the prompt speaks.
    assert push.decide(low, [0.0] * len(push.FEATURES), -50.0) > 0.5
    low[relevance] = 0.45
    assert push.decide(low, [0.0] * len(push.FEATURES), -50.0) < 0.5


def test_more_evidence_of_what_the_memory_is_about_raises_the_task_gate() -> None:
    weak = push.decide(push.features(evidence(keys=(reach("certificate", 0.5, 0.0),)), 1.0, 0.0))
    strong = push.decide(push.features(evidence(), 1.0, 0.0))
    general = push.decide(push.features(evidence(general=True), 1.0, 0.0))
    assert weak < strong and general < strong


@pytest.mark.parametrize(("prompt", "question"), [
    ("When is Priya's birthday?", True),
    ("which font should I use for the terminal", True),
    ("Priya 생일이 언제야?", True),
    ("우리 팀 슬랙 채널 이름이 뭐야", True),
    ("set up dark mode in vscode", False),
    ("inventory-sync 새 빌드 서버에 배포해줘", False),
    ("refactor this, it's unreadable: def calc(u, q, t): ...", False),
])
def test_a_question_is_told_from_a_task(prompt: str, question: bool) -> None:
    assert push.asks_question(prompt) is question


def test_what_a_memory_leaves_of_a_question_unexplained_counts_against_it() -> None:
    task = dict(zip(push.FEATURES, push.features(evidence(relevance=0.3), 1.0, 0.0), strict=True))
    asked = dict(zip(push.FEATURES, push.features(evidence(relevance=0.3, question=True), 1.0, 0.0), strict=True))
    assert task["question"] == 0.0 and task["question_unexplained"] == 0.0
    # 0.7 of the question is not covered, and it holds a third of the memory's words (by IDF).
    assert asked["question"] == 1.0 and asked["question_unexplained"] == pytest.approx(0.7 * (1 - 2.0 / 6.0))
    # The same evidence speaks for a task and less for a question it leaves unexplained.
    assert push.decide(tuple(asked.values())) < push.decide(tuple(task.values()))
    # A question that holds every specific word of the memory is not unexplained by it.
    words = (("staging", 2.0, True), ("pem", 4.0, True))
    held = dict(zip(push.FEATURES, push.features(evidence(relevance=0.3, question=True, terms=words), 1.0, 0.0),
                    strict=True))
    assert held["question_unexplained"] == 0.0


@pytest.mark.parametrize(("token", "expected"), [
    ("UNABLE_TO_VERIFY_LEAF_SIGNATURE", True), ("certs/staging-ca.pem", True), ("billing-api", True),
    ("InvalidFormatException", True), ("node18", True), ("TypeScript", False), ("PostgreSQL", False),
    ("staging", False), ("INFO", False), ("2026-11-30T03:12:09Z", False), ("e2e", False),
])
def test_identifiers_are_names_paths_and_error_signatures_not_words(token: str, expected: bool) -> None:
    assert push.is_identifier(token) is expected


def test_identifiers_that_differ_only_in_numbers_count_once() -> None:
    text = "worker-1 failed, worker-2 failed, see NODE_EXTRA_CA_CERTS and worker-3"
    assert push.identifiers_of(text) == ("worker-1", "node_extra_ca_certs")


def test_an_error_signature_reads_as_what_it_is_about() -> None:
    assert push.signature_concepts("every request dies with UNABLE_TO_VERIFY_LEAF_SIGNATURE") == ["TLS certificate"]
    assert push.identifier_phrases(["unable_to_verify_leaf_signature", "billing-api"]) == [
        "unable to verify leaf signature"]
    assert push.signature_concepts("rename the helper to parse_header") == []


@pytest.mark.parametrize(("prompt", "general"), [
    ("explain python's GIL in two paragraphs", True),
    ("what's the difference between TLS 1.2 and 1.3", True),
    ("프로세스랑 스레드 차이 설명해줘", True),
    ("set up drak mode in vs cdoe pls", False),
    ("the e2e run can't reach staging, take a look?", False),
])
def test_a_request_for_general_knowledge_is_told_from_a_task(prompt: str, general: bool) -> None:
    assert push.asks_general(prompt) is general


def test_a_key_typed_with_a_typo_is_still_named() -> None:
    runs = push.word_runs(["set", "up", "drak", "mode", "in", "vs", "cdoe", "pls"])
    assert push.misspelled_in("dark mode", runs)
    assert push.misspelled_in("gradle", push.word_runs(["gradel", "build", "broke"]))
    assert not push.misspelled_in("redis", push.word_runs(["reads", "the", "file"]))
    assert push.spelling_distance("drak", "dark", 1) == 1
    assert push.spelling_distance("staging", "status", 1) == 2


def test_a_long_paste_is_condensed_to_its_request_error_and_frames() -> None:
    log = "\n".join(f"2026-11-30T01:{i % 60:02d}:00Z worker INFO committed offset {i}" for i in range(3000))
    prompt = ("the ledger worker keeps crashing overnight, here is the log:\n" + log
              + "\nKafkaJSNumberOfRetriesExceeded: SASL authentication failed\n"
              + "    at Consumer.run (/srv/app/node_modules/kafkajs/src/consumer/index.js:244:19)\n")
    cut = push.condense(prompt)
    assert cut.condensed and len(cut.query) <= push.QUERY_CHARS
    assert cut.query.startswith("the ledger worker keeps crashing overnight")
    assert "KafkaJSNumberOfRetriesExceeded" in cut.query and "index.js:244:19" in cut.query
    assert cut.query.count("committed offset") <= 1, "log lines that differ in numbers count once"
    assert "kafkajsnumberofretriesexceeded" in cut.identifiers
    short = push.condense("set up dark mode in vscode")
    assert not short.condensed and short.query == "set up dark mode in vscode"


def test_why_names_what_matched_in_a_few_words() -> None:
    text = push.why(evidence(identifiers=("node_extra_ca_certs",)))
    assert text.startswith("names node_extra_ca_certs")
    assert 'names "staging"' in text and "shares staging" in text
    assert len(text.split("; ")) <= push.WHY_REASONS
    assert push.why(evidence(keys=(), terms=())) == "close in meaning"


# -- the session memory -----------------------------------------------------------------------


def test_a_session_remembers_what_it_was_shown_and_forgets_after_its_ttl() -> None:
    clock = FakeClock()
    sessions = push.SessionMemory(ttl=60.0, clock=clock)
    sessions.record("s1", ["m1"])
    sessions.record("s1", ["m2"])
    assert sessions.view("s1") == push.SessionView({"m1": 1, "m2": 2}, 2)
    assert sessions.view("s2").surfaced == {}
    clock.advance(59.0)
    assert "m1" in sessions.view("s1").surfaced
    sessions.record("s2", [])
    clock.advance(59.0)
    assert sessions.view("s1").surfaced == {}, "an idle session is forgotten"
    assert len(sessions) == 1


def test_the_session_memory_is_bounded() -> None:
    sessions = push.SessionMemory(ttl=3600.0, clock=FakeClock(), capacity=3)
    for i in range(5):
        sessions.record(f"s{i}", [f"m{i}"])
    assert len(sessions) == 3
    assert sessions.view("s0").surfaced == {} and sessions.view("s4").surfaced == {"m4": 1}
    one = push.SessionMemory(ttl=3600.0, clock=FakeClock())
    one.record("s", [f"m{i}" for i in range(push.SESSION_MEMORIES + 10)])
    assert len(one.view("s").surfaced) == push.SESSION_MEMORIES


def test_a_ttl_of_zero_remembers_nothing() -> None:
    sessions = push.SessionMemory(ttl=0.0, clock=FakeClock())
    sessions.record("s", ["m1"])
    assert sessions.view("s").surfaced == {}


# -- push.inject on a real graph ----------------------------------------------------------------

CERT = ("Staging uses a self-signed certificate: tests must set NODE_EXTRA_CA_CERTS to certs/staging-ca.pem.",
        ["staging", "certificate", "인증서", "TLS"])
DARK = ("The user prefers dark mode in every editor.", ["dark mode", "editor", "preference"])
LUNCH = ("팀 점심은 매주 수요일 열두 시 반에 회사 근처 국수집에서 먹는다.", ["점심", "회식"])
ERROR_PROMPT = "the e2e run can't reach staging, every request dies with UNABLE_TO_VERIFY_LEAF_SIGNATURE"


def seed(graph: MemoryGraph) -> dict[str, str]:
    return {"cert": remember(graph, *CERT), "dark": remember(graph, *DARK), "lunch": remember(graph, *LUNCH)}


def test_a_pasted_error_surfaces_the_memory_about_it_and_says_why(graph: MemoryGraph) -> None:
    ids = seed(graph)
    before = state(graph)
    result = push.inject(graph, ERROR_PROMPT, scope=None)
    assert [m.id for m in result.memories] == [ids["cert"]]
    assert "staging" in result.memories[0].why
    assert result.context is not None and "(why: " in result.context
    assert state(graph) == before, "injecting never reinforces"


def test_a_korean_prompt_saying_an_english_key_surfaces_its_memory(graph: MemoryGraph) -> None:
    ids = seed(graph)
    assert push.heard_keys(graph, "vscode에서 다크 모드를 설정해줘") == ["dark mode"]
    result = push.inject(graph, "vscode에서 다크 모드 설정해줘", scope=None)
    assert [m.id for m in result.memories][:1] == [ids["dark"]]


@pytest.mark.parametrize("prompt", ["Explain the difference between a process and a thread", "오늘 저녁 메뉴 추천해줘",
                                    "rename the helper in utils.py to parse_header"])
def test_a_prompt_no_memory_helps_with_surfaces_nothing(graph: MemoryGraph, prompt: str) -> None:
    seed(graph)
    result = push.inject(graph, prompt, scope=None)
    assert result.memories == [] and result.context is None


def test_what_a_session_was_shown_is_held_back_unless_clearly_the_subject_again(graph: MemoryGraph) -> None:
    ids = seed(graph)
    seen = push.SessionView({ids["cert"]: 1}, 1)
    again = push.inject(graph, ERROR_PROMPT, scope=None, session=seen)
    assert again.memories == [] and again.held_back == [ids["cert"]]
    fresh = push.inject(graph, ERROR_PROMPT, scope=None, session=push.SessionView({}, 0))
    assert [m.id for m in fresh.memories] == [ids["cert"]]
    assert fresh.context is not None and push.INJECT_HEADER in fresh.context
    # A later block of the session carries the short header: the first one said how to use them.
    dark = push.inject(graph, "set up dark mode in vscode", scope=None, session=seen)
    assert dark.context is not None and push.SESSION_HEADER in dark.context


def test_at_most_top_k_memories_are_surfaced(graph: MemoryGraph) -> None:
    for i in range(4):
        remember(graph, f"Billing service note {i}: the billing service deploys on Tuesdays.", ["billing service"])
    result = push.inject(graph, "When does the billing service deploy?", scope=None, top_k=2)
    assert 0 < len(result.memories) <= 2
