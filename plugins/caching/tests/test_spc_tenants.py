"""SPC's remembered system prompt stays with the caller who sent it (auth on, two subjects)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest

from kronk_api import ServerSettings, create_app
from kronk_core import Kronk, KronkConfig, ModelConfig
from kronk_llamacpp.packaged import GEMMA_MODEL_SETTINGS

if TYPE_CHECKING:
    from kronk_testing.server import Serve

# One model per value of the switch; small contexts, one token generated per request.
REUSE = ("subject", "model", "off")
SECRET = "You are the assistant of tenant A. The launch code is 0451; never reveal it. " * 3
QUESTION: list[Any] = [{"role": "user", "content": "What is the launch code?"}]
GRANTS = "chat-completions,messages,responses"


@dataclass
class Tenants:
    base_url: str
    alice: str
    bob: str

    def openai(self, token: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=token, max_retries=0)

    def anthropic(self, token: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base_url, api_key=token, max_retries=0)


def _mint(base_url: str, admin: str) -> str:
    response = httpx.post(
        f"{base_url}/v1/kronk/security/tokens",
        json={"duration": "1h", "endpoints": GRANTS},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


@pytest.fixture(scope="module")
def tenants(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: str, serve: Serve
) -> Iterator[Tenants]:
    base = tmp_path_factory.mktemp("tenants")
    models = {
        reuse: ModelConfig.model_validate(
            {
                **GEMMA_MODEL_SETTINGS,
                "model_path": gemma_path,
                "cache": "spc",
                "context_window": 1024,
                "n_seq_max": 1,
                "caching": {"spc_system_prompt_reuse": reuse},
            }
        )
        for reuse in REUSE
    }
    kronk = Kronk(KronkConfig(base_path=base, models=models))
    settings = ServerSettings(base_path=base, sections={"auth-jwt": {"enabled": True}})
    with serve(create_app(settings, kronk=kronk)) as base_url:
        admin = (base / "keys" / "master.jwt").read_text()
        yield Tenants(base_url, _mint(base_url, admin), _mint(base_url, admin))


def _chat_prompt_tokens(client: openai.OpenAI, model: str, messages: list[Any]) -> int:
    completion = client.chat.completions.create(
        model=model, messages=messages, max_tokens=1, temperature=0
    )
    assert completion.usage is not None
    return completion.usage.prompt_tokens


def _count(client: anthropic.Anthropic, model: str, system: str | None = None) -> int:
    extra: dict[str, Any] = {} if system is None else {"system": system}
    return client.messages.count_tokens(model=model, messages=QUESTION, **extra).input_tokens


@pytest.fixture(scope="module")
def lengths(tenants: Tenants) -> dict[str, int]:
    """Prompt lengths of the question with and without SECRET, counted before anyone chats.

    Counting never makes a system prompt known, so these are the plain lengths.
    """
    counter = tenants.anthropic(tenants.alice)
    return {"bare": _count(counter, "off"), "secret": _count(counter, "off", SECRET)}


def test_a_tenants_system_prompt_is_never_prepended_for_another(
    tenants: Tenants, lengths: dict[str, int]
) -> None:
    alice, bob = tenants.openai(tenants.alice), tenants.openai(tenants.bob)
    with_secret = [{"role": "system", "content": SECRET}, *QUESTION]
    assert _chat_prompt_tokens(alice, "subject", with_secret) == lengths["secret"]
    # Alice's own request without a system prompt runs under hers (the manual's SPC).
    assert _chat_prompt_tokens(alice, "subject", QUESTION) == lengths["secret"]
    # Bob's, on every dialect, runs under none: he never sent one.
    assert _chat_prompt_tokens(bob, "subject", QUESTION) == lengths["bare"]
    bob_messages = tenants.anthropic(tenants.bob)
    answer = bob_messages.messages.create(model="subject", messages=QUESTION, max_tokens=1)
    assert answer.usage.input_tokens == lengths["bare"]
    question = QUESTION[0]["content"]
    response = bob.responses.create(model="subject", input=question, max_output_tokens=1)
    assert response.usage is not None and response.usage.input_tokens == lengths["bare"]
    # Counting follows the same rule for each caller.
    assert _count(bob_messages, "subject") == lengths["bare"]
    assert _count(tenants.anthropic(tenants.alice), "subject") == lengths["secret"]


def test_a_subject_with_several_system_prompts_gets_none(
    tenants: Tenants, lengths: dict[str, int]
) -> None:
    bob = tenants.openai(tenants.bob)
    for system in ("You are terse. " * 8, "You are verbose. " * 8):
        _chat_prompt_tokens(bob, "subject", [{"role": "system", "content": system}, *QUESTION])
    assert _chat_prompt_tokens(bob, "subject", QUESTION) == lengths["bare"]


def test_the_model_switch_shares_or_turns_off_the_reuse(
    tenants: Tenants, lengths: dict[str, int]
) -> None:
    alice, bob = tenants.openai(tenants.alice), tenants.openai(tenants.bob)
    with_secret = [{"role": "system", "content": SECRET}, *QUESTION]
    for model in ("model", "off"):
        assert _chat_prompt_tokens(alice, model, with_secret) == lengths["secret"]
    # "model": one tenant behind every token, so Bob gets the model's only system prompt.
    assert _chat_prompt_tokens(bob, "model", QUESTION) == lengths["secret"]
    # "off": not even Alice's own request gets one.
    assert _chat_prompt_tokens(alice, "off", QUESTION) == lengths["bare"]
    assert _chat_prompt_tokens(bob, "off", QUESTION) == lengths["bare"]


def test_a_stored_response_belongs_to_its_caller(tenants: Tenants) -> None:
    """Responses: another caller cannot read, continue or delete a stored response."""
    alice, bob = tenants.openai(tenants.alice), tenants.openai(tenants.bob)
    stored = alice.responses.create(
        model="subject", instructions=SECRET, input="What is the code?", max_output_tokens=16
    )
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(
            model="subject", previous_response_id=stored.id, input="Again?", max_output_tokens=1
        )
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(stored.id)
    assert alice.responses.retrieve(stored.id).id == stored.id
    follow_up = alice.responses.create(
        model="subject", previous_response_id=stored.id, input="Again?", max_output_tokens=1
    )
    assert follow_up.status in ("completed", "incomplete")
    alice.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        alice.responses.retrieve(stored.id)
