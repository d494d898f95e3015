"""docs/openapi.json (scripts/openapi.py): what the routes generate, committed, so that a route
added or changed without regenerating the document fails here (and `nox -s docs`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

# The generator composes the app from the installed plugins when it runs.
pytestmark = pytest.mark.needs_plugins

ROOT = Path(__file__).resolve().parents[1]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi", ROOT / "scripts" / "openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


openapi = _generator()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    generated: dict[str, Any] = openapi.document()
    return generated


def test_the_committed_document_is_what_the_routes_generate(document: dict[str, Any]) -> None:
    committed = openapi.DOCUMENT.read_text(encoding="utf-8")
    assert committed == openapi.render(document), (
        f"docs/openapi.json is out of date: regenerate it with `{openapi.REGENERATE}`"
    )
    assert openapi.render(openapi.document()) == committed  # the same bytes every time


def test_it_holds_every_api_s_routes_tagged_with_their_plugin(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    expected = {
        ("/v1/chat/completions", "post"): "openai",
        ("/v1/responses", "post"): "openai",
        ("/v1/tokenize", "post"): "openai",
        ("/v1/models/{model_id}", "get"): "openai",
        ("/v1/messages", "post"): "anthropic",
        ("/v1/messages/count_tokens", "post"): "anthropic",
        ("/api/chat", "post"): "ollama",
        ("/api/tags", "get"): "ollama",
        ("/v1/embeddings", "post"): "embeddings",
        ("/v1/rerank", "post"): "embeddings",
        ("/v1/kronk/pulls", "post"): "catalog",
        ("/v1/kronk/security/tokens", "post"): "auth-jwt",
        ("/v1/liveness", "get"): openapi.SERVER_TAG,
        ("/v1/readiness", "get"): openapi.SERVER_TAG,
        ("/health", "get"): openapi.SERVER_TAG,
        ("/v1/kronk/slots", "get"): openapi.SERVER_TAG,
        ("/v1/kronk/models/{model_id}/unload", "post"): openapi.SERVER_TAG,
    }
    for (path, method), tag in expected.items():
        assert document["paths"][path][method]["tags"] == [tag], (path, method)
    tags = {tag["name"] for tag in document["tags"]}
    assert tags >= set(expected.values())
    # Left out on purpose (include_in_schema=False): the UI's pages, /metrics.
    assert not {"/", "/metrics", "/ui/{name}"} & set(document["paths"])


def test_operations_have_summaries_and_kronk_s_errors(document: dict[str, Any]) -> None:
    operations = [op for item in document["paths"].values() for op in item.values()]
    assert all(op["summary"] and "default" in op["responses"] for op in operations)
    # Litestar's validation error shape is not what Kronk answers.
    assert not any("400" in op["responses"] for op in operations)
    unload = document["paths"]["/v1/kronk/models/{model_id}/unload"]["post"]
    assert unload["summary"] == (
        "Unload a model now; requests still running on it end with an error."
    )
    liveness = document["paths"]["/v1/liveness"]["get"]
    assert liveness["summary"] == (
        "Whether the process answers: 200 while it runs, loaded models or not."
    )
    assert all(op.get("description") for op in operations), "a handler without a docstring"


def test_a_handler_without_a_docstring_is_summarised_by_its_name() -> None:
    def list_widgets() -> None:
        pass

    operation: dict[str, Any] = {"description": "from Litestar"}
    openapi._describe(operation, list_widgets)
    assert operation == {"summary": "List widgets"}


@pytest.mark.parametrize(
    ("path", "model", "field"),
    [
        ("/v1/chat/completions", "ChatCompletionRequest", "messages"),
        ("/v1/messages", "MessagesRequest", "messages"),
        ("/api/chat", "ChatBody", "messages"),
        ("/v1/embeddings", "EmbeddingsRequest", "input"),
        ("/v1/kronk/security/tokens", "TokenRequest", "endpoints"),
    ],
)
def test_a_handler_s_request_model_is_its_body_schema(
    document: dict[str, Any], path: str, model: str, field: str
) -> None:
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": f"#/components/schemas/{model}"}
    assert field in document["components"]["schemas"][model]["properties"]


class Scales(BaseModel):
    value: float


async def parses(request: Any) -> None:
    await parse_body(request, Scales)


async def validates(request: Any) -> None:
    Scales.model_validate(await request.body())


async def reads_nothing(request: Any) -> None:
    Scales.model_validate({"value": 1})


async def parse_body(request: Any, model: type[BaseModel]) -> None: ...


def test_the_body_model_is_read_from_the_handler_s_code() -> None:
    assert openapi.body_model(parses) is Scales
    assert openapi.body_model(validates) is Scales
    assert openapi.body_model(reads_nothing) is None
