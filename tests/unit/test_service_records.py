"""Issue 20: ``Service`` answers with typed records, which the routes convert once."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_api_routes import client_for, settings_for

from keymem_daemon.engine.records import render
from keymem_daemon.mcp import instructions
from keymem_daemon.service import DaemonStats, Health, Prompt, RenderedPrompt, Service

pytestmark = pytest.mark.timeout(60)


def test_the_service_answers_with_records_the_routes_render_unchanged(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    service = Service(settings)
    health, stats = service.health(), service.stats()
    assert isinstance(health, Health) and health.status == "starting" and health.error is None
    assert isinstance(stats, DaemonStats) and stats.counts is None and stats.store == settings.store_description
    prompts = service.prompts()
    assert [type(p) for p in prompts] == [Prompt] and prompts[0].name == instructions.PROMPT_NAME
    prompt = service.get_prompt(instructions.PROMPT_NAME)
    assert isinstance(prompt, RenderedPrompt) and prompt.messages[0].role == "user"
    with client_for(service, settings) as client:
        assert client.get("/health").json() == render(health)  # no error/detail/warnings while starting
        body = client.get("/v1/stats").json()
        assert {k: v for k, v in body.items() if k != "uptime_s"} == {
            k: v for k, v in stats.as_dict().items() if k != "uptime_s"}
        assert client.get("/v1/prompts").json() == {"prompts": render(prompts)}
        assert client.get(f"/v1/prompts/{instructions.PROMPT_NAME}").json() == render(prompt)
