"""Error codes by who reads them: the server's own routes answer with the Kronk manual's
codes (§8.10: `not_found`, `unauthenticated`, `invalid_argument`, `internal`), the
OpenAI-compatible routes with OpenAI's (`model_not_found`), in the same shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_testing.plugin import ScriptedKronk
from kronk_testing.server import Serve

KEY = "sk-local-test-key"
CHAT = {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def base_url(scripted_kronk: ScriptedKronk, serve: Serve, tmp_path: Path) -> Iterator[str]:
    settings = ServerSettings(base_path=tmp_path, sections={"auth-jwt": {"api_key": KEY}})
    with serve(create_app(settings, kronk=scripted_kronk())) as url:
        yield url


def code_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    return str(error["code"])


def test_kronk_s_routes_use_the_manual_s_codes_and_openai_s_routes_openai_s(
    base_url: str,
) -> None:
    key = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=key) as http:
        assert code_of(http.post("/v1/kronk/models/no-such-model/unload"), 404) == "not_found"
        assert code_of(http.delete("/v1/kronk/models/no-such-model"), 404) == "not_found"
        assert code_of(http.get("/v1/kronk/catalog/no-such-model"), 404) == "not_found"
        assert code_of(http.post("/v1/chat/completions", json=CHAT), 404) == "model_not_found"
        assert code_of(http.get("/v1/models/no-such-model"), 404) == "model_not_found"
        bad = {"model": "no-such-model", "messages": "not a list"}
        assert code_of(http.post("/v1/chat/completions", json=bad), 400) == "invalid_argument"
    with httpx.Client(base_url=base_url) as anonymous:
        assert code_of(anonymous.get("/v1/kronk/models"), 401) == "unauthenticated"
        assert code_of(anonymous.get("/v1/kronk/catalog"), 401) == "unauthenticated"
        assert code_of(anonymous.post("/v1/chat/completions", json=CHAT), 401) == "invalid_token"
