"""Synthetic memories for the performance benchmarks: a keymem-export document.

    python scripts/synthetic_store.py 10000 > store.json

Memories read like a coding agent's notes (decisions, preferences, people, deployments),
about a third in Korean. Each has 3-6 keys drawn from a Zipf-like vocabulary, so a few keys
are hubs with hundreds of memories and most are rare -- the shape real stores have. The
generator is seeded: the same size always gives the same store.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

SUBJECTS_EN = ("the user", "the team", "our service", "the Atlas project", "the billing API", "Priya",
               "Marcus", "the mobile app", "the data pipeline", "the on-call rotation")
VERBS_EN = ("prefers", "decided to use", "moved to", "deploys with", "depends on", "replaced",
            "reviews", "benchmarks", "documents", "monitors")
SUBJECTS_KO = ("사용자는", "우리 팀은", "아틀라스 프로젝트는", "결제 서비스는", "모바일 앱은", "데이터 파이프라인은")
VERBS_KO = ("선호한다", "사용하기로 했다", "옮겼다", "배포한다", "의존한다", "교체했다", "검토한다")
EN_WORDS = ("deployment", "database", "editor", "preference", "review", "incident", "rollback", "cache",
            "migration", "latency", "testing", "python", "typescript", "kubernetes", "docker", "postgres",
            "redis", "kafka", "logging", "metrics", "alerting", "release", "branch", "schema", "index",
            "queue", "worker", "cron", "backup", "security", "token", "auth", "frontend", "backend",
            "design", "meeting", "deadline", "budget", "hiring", "lunch", "coffee", "hiking", "music")
KO_WORDS = ("배포", "데이터베이스", "에디터", "선호", "리뷰", "장애", "롤백", "캐시", "마이그레이션", "지연",
            "테스트", "파이썬", "쿠버네티스", "도커", "로그", "모니터링", "알림", "릴리스", "브랜치", "스키마",
            "백업", "보안", "인증", "프론트엔드", "백엔드", "회의", "마감", "예산", "채용", "점심", "커피", "등산")


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """Base words plus generated specific terms (service names, tickets), most common first."""
    words = list(EN_WORDS) + list(KO_WORDS)
    rng.shuffle(words)
    for i in range(size):
        kind = i % 4
        if kind == 0:
            words.append(f"svc-{i:05d}")
        elif kind == 1:
            words.append(f"JIRA-{i}")
        elif kind == 2:
            words.append(f"module{i}")
        else:
            words.append(f"기능{i}")
    return words


def zipf_pick(words: list[str], rng: random.Random) -> str:
    # Rank r is drawn with probability ~ 1/r: a few hubs, a long tail of rare keys.
    rank = int(len(words) ** rng.random()) - 1
    return words[min(len(words) - 1, max(0, rank))]


def generate(count: int, *, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    words = vocabulary(max(200, count // 3), rng)
    keys: dict[str, dict[str, Any]] = {}
    memories, links = [], []
    start = 1_700_000_000.0
    for n in range(count):
        chosen: list[str] = []
        while len(chosen) < rng.randint(3, 6):
            word = zipf_pick(words, rng)
            if word not in chosen:
                chosen.append(word)
        korean = rng.random() < 0.33
        if korean:
            content = (f"{rng.choice(SUBJECTS_KO)} {chosen[0]}와 {chosen[1]} 관련해서 {chosen[-1]}을 "
                       f"{rng.choice(VERBS_KO)} (메모 {n}).")
        else:
            content = (f"{rng.choice(SUBJECTS_EN).capitalize()} {rng.choice(VERBS_EN)} {chosen[0]} for "
                       f"{chosen[1]}, see {chosen[-1]} (note {n}).")
        mid = f"{n:012x}"
        created = start + n * 60.0
        memories.append({"id": mid, "content": content, "namespace": "default" if n % 5 else "project-atlas",
                         "created_at": created, "updated_at": created, "last_confirmed_at": created})
        for word in chosen:
            key = keys.get(word)
            if key is None:
                key = keys[word] = {"id": f"{len(keys) + 1:012x}"[::-1], "concept": word,
                                    "key_type": "concept", "aliases": []}
            links.append({"key_id": key["id"], "memory_id": mid, "weight": 1.0})
    return {"format": "keymem-export", "version": 1, "keys": list(keys.values()), "memories": memories,
            "links": links, "relations": [], "alias_candidates": []}


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    json.dump(generate(count), sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
