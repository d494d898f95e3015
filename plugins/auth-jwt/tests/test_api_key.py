"""`--api-key` (`KRONK_API_KEY`, `auth-jwt.api_key`): one static key for a single-user
server, as llama-server and vLLM have it. The key, sent as a bearer token or as x-api-key,
may do anything; nothing else may, but health checks stay open; with JWT auth on too, its
tokens keep working. On the scripted model: what is checked is the guard, not a model."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_api.options import ServerStartCommand
from kronk_auth_jwt.settings import SETTINGS
from kronk_testing.auth import bearer, mint, serving_with_auth
from kronk_testing.plugin import SCRIPTED_MODEL_ID, ScriptedKronk
from kronk_testing.scripted import Script
from kronk_testing.server import serving

KEY = "correct horse battery staple"
CHAT = {"model": SCRIPTED_MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
REPLY = Script().default


def test_the_flag_the_variable_and_the_setting_name_the_same_key() -> None:
    command = ServerStartCommand("start")
    for params, environ in (({"other__api_key": KEY}, {}), ({}, {"KRONK_API_KEY": KEY})):
        settings = ServerSettings.model_validate(command.overrides(params, environ))
        section = SETTINGS.of(settings)
        assert section.api_key is not None and section.api_key.get_secret_value() == KEY
        assert KEY not in repr(section)  # a secret: never printed with the settings
    nested = ServerSettings.model_validate({"auth-jwt": {"api_key": KEY}})
    assert SETTINGS.of(nested).api_key is not None


def test_only_the_key_passes_and_health_checks_stay_open(
    scripted_kronk: ScriptedKronk, tmp_path: Path
) -> None:
    kronk = scripted_kronk()
    settings = ServerSettings(base_path=tmp_path, sections={"auth-jwt": {"api_key": KEY}})
    with serving(create_app(settings, kronk=kronk)) as base_url:
        chat = f"{base_url}/v1/chat/completions"
        anonymous = httpx.post(chat, json=CHAT)
        assert anonymous.status_code == 401
        assert "missing API key" in anonymous.json()["error"]["message"]
        for wrong in (KEY[:-1], KEY + "!", KEY.upper(), "x"):
            refused = httpx.post(chat, json=CHAT, headers={"Authorization": f"Bearer {wrong}"})
            assert refused.status_code == 401, wrong
        basic = httpx.post(chat, json=CHAT, headers={"Authorization": f"Basic {KEY}"})
        assert basic.status_code == 401
        assert httpx.get(f"{base_url}/v1/models").status_code == 401
        # The key may do anything, an operator's route included.
        assert httpx.get(f"{base_url}/v1/kronk/slots", headers=bearer(KEY)).status_code == 200
        for open_route in ("/v1/liveness", "/v1/readiness"):
            assert httpx.get(f"{base_url}{open_route}").status_code == 200, open_route

        # The clients, as their users configure them: OPENAI_API_KEY, ANTHROPIC_API_KEY.
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0) as client:
            answer = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            assert answer.choices[0].message.content == REPLY
        with anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0) as claude:
            message = claude.messages.create(max_tokens=64, **CHAT)  # type: ignore[arg-type]
            assert message.content[0].text == REPLY  # type: ignore[union-attr]
        with (
            anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0) as claude,
            pytest.raises(anthropic.AuthenticationError),
        ):
            claude.messages.create(max_tokens=64, **CHAT)  # type: ignore[arg-type]


def test_with_jwt_auth_on_too_its_tokens_keep_working(scripted_kronk: ScriptedKronk) -> None:
    kronk = scripted_kronk()
    with serving_with_auth(kronk, {"api_key": KEY}) as server:
        chat = f"{server.base_url}/v1/chat/completions"
        assert httpx.post(chat, json=CHAT, headers=bearer(KEY)).status_code == 200
        # Keys and tokens are still managed with the JWT admin token, or with the key.
        user = mint(server, "chat-completions")
        assert httpx.post(chat, json=CHAT, headers=bearer(user)).status_code == 200
        listed = httpx.get(f"{server.base_url}/v1/kronk/security/keys", headers=bearer(KEY))
        assert listed.status_code == 200, listed.text
        refused = httpx.post(chat, json=CHAT, headers=bearer("not-a-token"))
        assert refused.status_code == 401
