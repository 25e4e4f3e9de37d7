"""Loanwords Kiwi misreads: a Hangul key that sounds like a Latin word of its memory
(커버리지 / coverage, 지라 / Jira) and that Kiwi cuts into verbs or drops is learned as a
noun, and the store's lexical index is cut again wherever the word occurs -- at once, when a
store is opened by an analyser that knows more words, and when an older store is opened.

Learning changes Kiwi for the whole process, so these tests use analysers of their own
(each a real Kiwi) and never the process-wide one the other tests share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import FakeClock, StoreAt, db_read, db_write, key_id, open_graph, remember

from keymem_daemon.config import Settings
from keymem_daemon.engine import transfer
from keymem_daemon.engine.graph import MemoryGraph
from keymem_daemon.engine.indexes import VOCABULARY_META
from keymem_daemon.engine.reads.hybrid import hybrid_recall
from keymem_daemon.engine.text import Analyzer
from keymem_daemon.inference.embedders import Embedder

pytestmark = pytest.mark.timeout(120)

DOCKER_IMAGE = "도커 이미지는 ECR에 올리고 태그는 커밋 해시로 단다."
DOCKER_BUILD = "도커로 로컬 빌드를 할 때는 BuildKit 캐시를 켠다."


def fts_tokens(graph: MemoryGraph, memory_id: str) -> tuple[list[str], list[str]]:
    """The memory's row of the lexical index: its content tokens and its key tokens."""
    return graph.store.read(lambda reader: reader.indexed_tokens([memory_id]))[memory_id]


Opener = Callable[[Path, Analyzer], AbstractContextManager[MemoryGraph]]


@pytest.fixture
def opened(embedder: Embedder, settings: Settings, clock: FakeClock, backend: str,
           new_store: Callable[[str], StoreAt]) -> Opener:
    """``with opened(path, analyzer) as graph``: the store at ``path``, read by ``analyzer``
    (on PostgreSQL, a database of its own for each path)."""
    databases: dict[Path, StoreAt] = {}

    @contextmanager
    def open_with(path: Path, analyzer: Analyzer) -> Iterator[MemoryGraph]:
        if backend == "postgres" and path not in databases:
            databases[path] = new_store(path.stem)
        graph = open_graph(databases.get(path, path), embedder, settings, clock, analyzer)
        try:
            yield graph
        finally:
            graph.close()

    return open_with


@pytest.fixture(scope="module")
def reader() -> Analyzer:
    """An analyser that is only asked, never taught."""
    return Analyzer()


@pytest.fixture(scope="module")
def learner() -> Analyzer:
    """One analyser for the module's tests that only need learning to have happened."""
    analyzer = Analyzer()
    analyzer.preload_kiwi()
    return analyzer


@pytest.mark.parametrize(
    ("keys", "text", "learned"),
    [
        (["테스트 커버리지", "coverage", "CI"], "테스트 커버리지는 80% 이상", ["커버리지"]),  # 크+어+버리+지
        (["지라", "티켓"], "Tickets live in Jira.", ["지라"]),  # 지+라; the Latin word is in the text
        (["맵", "렌더링"], "The map view uses Mapbox.", ["맵"]),  # the adjective 맵다
        (["훅", "pre-commit"], "Pre-commit hooks run ruff.", ["훅"]),  # an adverb; hooks sounds like its stem
        (["느린 쿼리", "slow query"], "쿼리가 느리다", []),  # a real Korean word sounds like nothing here
        (["배포", "deploy"], "", []),  # Kiwi reads it as a noun already
        (["지라"], "티켓은 지라에서 관리한다", []),  # misread, but no Latin word sounds like it
    ],
)
def test_a_misread_hangul_key_that_sounds_like_a_latin_word_of_its_memory_is_a_loanword(
    reader: Analyzer, keys: list[str], text: str, learned: list[str]
) -> None:
    assert reader.loanwords(keys, text) == learned


def test_a_learned_loanword_is_cut_whole_in_every_sentence(learner: Analyzer) -> None:
    assert learner.learn(["도커", "지라"]) == ["도커", "지라"]
    assert learner.learn(["도커"]) == []
    assert {"도커", "지라"} <= learner.learned
    for word, sentence in [("도커", DOCKER_IMAGE), ("도커", DOCKER_BUILD), ("도커", "어제 도커 문제가 있었다"),
                           ("지라", "지라에서 티켓을 닫아"), ("지라", "지라 설정을 바꿨다")]:
        assert word in learner.index_tokens(sentence), sentence
    assert learner.compact("도커") == "도커"
    assert learner.key_tokens("지라") == ("지라",)


def test_learning_pays_for_kiwis_rebuild_so_the_next_read_does_not() -> None:
    """Kiwi rebuilds its model on the first analysis after ``add_user_word`` (about 0.25 s
    here). That analysis is the learn's own, so the prompt after it (the hook's read, or the
    first query after a daemon start that learned its store's words) runs at full speed."""
    analyzer = Analyzer()
    analyzer.preload_kiwi()
    analyzer.analyze("워밍업 문장")
    started = time.perf_counter()
    analyzer.learn(["지라"])
    learned = time.perf_counter() - started
    started = time.perf_counter()
    analyzer.analyze("노션은 뭐에 써?")
    read = time.perf_counter() - started

    # Had the read paid for the rebuild, it would take the learn's time and the learn almost
    # none; a factor of 2 tells the two apart with room for a busy machine's preemptions.
    assert read * 2 < learned, (read, learned)


def test_threads_teaching_the_same_word_at_once_all_succeed_and_one_teaches_it() -> None:
    """The first holds the analyser through Kiwi's rebuild; the others, which saw the word
    as new before it, find it taught when their turn comes."""
    analyzer = Analyzer()
    analyzer.preload_kiwi()
    start = threading.Barrier(4)

    def teach() -> list[str]:
        start.wait()
        return analyzer.learn(["지라"])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: teach(), range(4)))

    assert sorted(results) == [[], [], [], ["지라"]]
    assert analyzer.learned == {"지라"}


def test_remembering_a_loanword_key_recuts_the_memories_and_keys_that_hold_it(
    tmp_path: Path, opened: Opener
) -> None:
    with opened(tmp_path / "keymem.db", Analyzer()) as graph:
        image = remember(graph, DOCKER_IMAGE, ["ECR", "도커 이미지"])
        assert "도커" not in fts_tokens(graph, image)[0]  # Kiwi alone: 도/크/어
        build = remember(graph, DOCKER_BUILD, ["도커", "Docker", "빌드"])
        assert "도커" in graph.analyzer.learned
        content, keys = fts_tokens(graph, image)
        assert "도커" in content and "도커" in keys
        assert "도커" in fts_tokens(graph, build)[0]
        assert graph.keys.get(key_id(graph, "도커 이미지")).compact == "도커이미지"  # type: ignore[union-attr]


# Each loanword memory beside one that shares the rest of the question's words.
TOOLS = [
    ("스프린트 작업은 전부 지라에서 관리하고, 상태는 매일 갱신한다.", ["지라", "Jira", "스프린트"]),
    ("개인 할 일은 노션에서 관리한다.", ["노션", "Notion", "할 일"]),
    ("맵 화면은 Mapbox GL로 그린다.", ["맵", "map", "Mapbox"]),
    ("차트는 ECharts로 그린다.", ["차트", "chart"]),
]


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("지라에서 뭐 관리해?", 0),  # Kiwi alone drops 지라 here: the Notion memory came first
        ("지라 어떻게 써?", 0),
        ("맵은 뭘로 그려?", 2),  # Kiwi alone: 맵 is 맵다, and the chart memory came first
        ("맵 렌더링 라이브러리가 뭐야?", 2),  # Kiwi alone: nothing found
    ],
)
def test_a_question_naming_a_loanword_finds_the_memory_about_it(
    tmp_path: Path, opened: Opener, learner: Analyzer, question: str, answer: int
) -> None:
    with opened(tmp_path / "keymem.db", learner) as graph:
        ids = [remember(graph, content, keys) for content, keys in TOOLS]
        hits = hybrid_recall(graph, question, reinforce=False).hits
        assert hits and hits[0].id == ids[answer], [h.content for h in hits]


def test_a_store_remembers_its_loanwords_for_a_fresh_analyser(tmp_path: Path, opened: Opener) -> None:
    with opened(tmp_path / "keymem.db", Analyzer()) as graph:
        remember(graph, "지라 보드는 매주 금요일에 정리한다.", ["지라", "Jira"])
    fresh = Analyzer()
    with opened(tmp_path / "keymem.db", fresh):
        assert fresh.learned == {"지라"}
        assert "지라" in fresh.index_tokens("지라에서 티켓을 닫아")


def test_a_store_opened_by_an_analyser_that_knows_more_words_is_cut_again(
    tmp_path: Path, opened: Opener, learner: Analyzer
) -> None:
    """Another store of the process taught the analyser 도커 (here: the module's learner)."""
    with opened(tmp_path / "keymem.db", Analyzer()) as graph:
        image = remember(graph, DOCKER_IMAGE, ["ECR", "이미지"])
    learner.learn(["도커"])
    with opened(tmp_path / "keymem.db", learner) as graph:
        assert "도커" in fts_tokens(graph, image)[0]


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM meta WHERE name = ?",  # a store from a keymem that did not learn loanwords
        "UPDATE meta SET value = '[1, \"\"]' WHERE name = ?",  # damaged
    ],
)
def test_a_store_without_a_readable_list_is_searched_for_the_loanwords_its_keys_hold(
    tmp_path: Path, opened: Opener, learner: Analyzer, damage: str, backend: str
) -> None:
    # Whoever wrote the store (the module's learner: the damage below replaces its list and
    # its cut of the word), the fresh analyser learns from the keys alone.
    with opened(tmp_path / "keymem.db", learner) as graph:
        mapped = remember(graph, "맵 화면은 Mapbox GL로 그린다.", ["맵", "map", "Mapbox"])
        remember(graph, "느린 쿼리는 slow log에서 찾는다.", ["느린 쿼리", "slow query"])
        # As an older keymem left it: 맵 (read as the adjective 맵다) dropped from the index.
        db_write(graph.store, lambda c: c.execute(damage, (VOCABULARY_META,)))
        db_write(graph.store, lambda c: c.execute(
            "UPDATE memory_fts SET content_tokens = '화면 mapbox gl 그리', key_tokens = 'map mapbox' "
            + ("WHERE rowid = (SELECT rowid FROM memories WHERE id = ?)" if backend == "sqlite"
               else "WHERE memory_id = ?"), (mapped,)))
    fresh = Analyzer()
    with opened(tmp_path / "keymem.db", fresh) as graph:
        assert fresh.learned == {"맵"}
        content, keys = fts_tokens(graph, mapped)
        assert "맵" in content and "맵" in keys
        assert db_read(graph.store, lambda c: c.execute(
            "SELECT value FROM meta WHERE name = ?", (VOCABULARY_META,)).fetchone()[0]) == '["맵"]'


def test_an_import_learns_the_loanwords_of_its_keys(tmp_path: Path, opened: Opener, learner: Analyzer) -> None:
    # The export carries no list of learned words: what the source's analyser knew is not imported.
    with opened(tmp_path / "a.db", learner) as source:
        remember(source, "테스트 커버리지는 80% 이상을 유지한다.", ["테스트 커버리지", "coverage"])
        exported = transfer.export(source)
    fresh = Analyzer()
    with opened(tmp_path / "b.db", fresh) as target:
        transfer.import_data(target, exported)
        assert fresh.learned == {"커버리지"}
        (memory,) = db_read(target.store, lambda c: c.execute("SELECT id FROM memories").fetchall())
        assert "커버리지" in fts_tokens(target, memory[0])[0]


def test_an_english_only_store_never_loads_kiwi(tmp_path: Path, opened: Opener) -> None:
    """Looking for loanwords costs an English-only user nothing: Kiwi is ~190 MB."""
    analyzer = Analyzer()
    for _ in range(2):  # a new store, then the same store opened again
        with opened(tmp_path / "keymem.db", analyzer) as graph:
            remember(graph, "Docker images go to ECR, tagged with the commit hash.", ["Docker", "ECR"])
            hybrid_recall(graph, "Where do Docker images go?", reinforce=False)
    assert not analyzer.kiwi_loaded


class Interleaving:
    """The real embedder, which runs ``action`` (another client's request) the first time
    it is asked to embed ``trigger``: that request falls between two of a batch's items."""

    def __init__(self, inner: Embedder, trigger: str, action: Callable[[], object]) -> None:
        self.inner, self.trigger, self.action = inner, trigger, action
        self.name, self.fingerprint, self.dim, self.profile = inner.name, inner.fingerprint, inner.dim, inner.profile

    def embed(self, texts: Sequence[str]) -> Any:
        if self.trigger in texts:
            self.trigger = ""
            self.action()
        return self.inner.embed(texts)


def test_a_batch_item_cut_before_another_request_taught_a_word_is_cut_again(
    store_at: StoreAt, embedder: Embedder, settings: Settings, clock: FakeClock
) -> None:
    graph: MemoryGraph
    interleaving = Interleaving(embedder, "second item", lambda: remember(graph, DOCKER_BUILD, ["도커", "Docker"]))
    graph = open_graph(store_at, interleaving, settings, clock, Analyzer())
    try:
        result = graph.remember_batch([graph.prepare(content=DOCKER_IMAGE, keys=["ECR"]),
                                       graph.prepare(content="second item", keys=["batch"])])
        assert "도커" in graph.analyzer.learned
        image = result.items[0].saved  # type: ignore[union-attr]
        assert "도커" in fts_tokens(graph, image)[0]  # type: ignore[arg-type]
    finally:
        graph.close()


def test_concurrent_writes_that_teach_words_leave_every_memory_cut_with_all_of_them(
    tmp_path: Path, opened: Opener
) -> None:
    """Six clients at once, each teaching one word with every write; every memory's text
    holds all six. A memory cut before another client's word was learned is cut again."""
    pairs = [("도커", "Docker"), ("지라", "Jira"), ("맵", "map"), ("커버리지", "coverage"),
             ("온보딩", "onboarding"), ("샤딩", "sharding")]
    words = {hangul for hangul, _ in pairs}
    with opened(tmp_path / "keymem.db", Analyzer()) as graph:

        def client(pair: tuple[str, str]) -> list[str]:
            return [remember(graph, f"{n}번 메모: 도커 지라 맵 커버리지 온보딩 샤딩 문서를 정리했다.", list(pair))
                    for n in range(4)]

        with ThreadPoolExecutor(len(pairs)) as pool:
            saved = [mid for ids in pool.map(client, pairs) for mid in ids]
        assert graph.analyzer.learned == words
        for memory_id in saved:
            content, _ = fts_tokens(graph, memory_id)
            assert words <= set(content), content
