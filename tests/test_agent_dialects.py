"""Today's coding agents, in every dialect, as they really ask: the first requests of Claude
Code 2.1.332, Codex CLI 0.171.0 and OpenCode 1.18.33 (captured, tests/data/agents) are served
on the real Gemma 3 270M left at its default context (its 32768-token training length); what
Kronk cannot serve is left out and named in the x-kronk-omitted-tools header; and a prompt
past a small context is answered in the shape each client acts on (Claude Code compacts on
Anthropic's `prompt is too long`, Codex on a `response.failed` with `context_length_exceeded`,
OpenCode on that code or its overflow patterns).

Each captured request is prefilled once (Claude Code's is ~21k tokens); the rest are
cut-down versions of the same shapes."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from kronk_api import ServerSettings, create_app
from kronk_api.client_extras import OMITTED_TOOLS_HEADER

if TYPE_CHECKING:
    from kronk_testing.server import Serve

AGENTS = Path(__file__).parent / "data" / "agents"
AGENT = "agent-model"
SMALL = "agent-small"
SMALL_CONTEXT = 4096
# Headers of the capture that belong to its connection, not to the request.
CONNECTION_HEADERS = {"host", "content-length", "connection", "accept-encoding"}
TIMEOUT = httpx.Timeout(600.0)

# OpenCode 1.18's overflow test (packages/opencode/src/provider/error.ts): a 413, the code
# context_length_exceeded, or one of these patterns in the message.
OPENCODE_OVERFLOW = [
    r"prompt is too long",
    r"exceeds the context window",
    r"maximum context length is \d+ tokens",
    r"exceeds the available context size",
    r"context[_ ]length[_ ]exceeded",
]


@pytest.fixture(scope="module")
def agents(
    tmp_path_factory: pytest.TempPathFactory, gemma_path: str, serve: Serve
) -> Iterator[str]:
    """Gemma at its default context (no context_window: its training length, 32768 tokens)
    under the names the agents send, and at 4096 (SMALL) to overflow; one slot each, with
    the message cache."""
    base = tmp_path_factory.mktemp("agent-dialects")
    models = base / "models.yaml"
    models.write_text(
        f"models:\n"
        f"  {AGENT}:\n"
        f"    model_path: {gemma_path}\n"
        f"    n_seq_max: 1\n"
        f"    cache: imc\n"
        f"    aliases: [claude-sonnet-4-6, claude-haiku-4-5]\n"
        f"  {SMALL}:\n"
        f"    model_path: {gemma_path}\n"
        f"    context_window: {SMALL_CONTEXT}\n"
        f"    n_seq_max: 1\n"
    )
    app = create_app(ServerSettings(base_path=base, model_config_file=models))
    with serve(app) as base_url:
        yield base_url


def captured(name: str) -> dict[str, Any]:
    capture: dict[str, Any] = json.loads((AGENTS / name).read_text())
    return capture


def send(base_url: str, capture: dict[str, Any], **changes: Any) -> httpx.Response:
    """The captured request, with `changes` to its body, as the client sent it."""
    headers = {
        name: value
        for name, value in capture["headers"].items()
        if name.lower() not in CONNECTION_HEADERS
    }
    body = {**capture["body"], **changes}
    return httpx.post(base_url + capture["path"], json=body, headers=headers, timeout=TIMEOUT)


def events(response: httpx.Response) -> list[tuple[str | None, dict[str, Any]]]:
    """The server-sent events of a whole response: (event name, data)."""
    out = []
    for frame in response.text.split("\n\n"):
        lines = [line for line in frame.splitlines() if not line.startswith(":")]
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        if not data or data == ["[DONE]"]:
            continue
        name = next(
            (line.removeprefix("event: ") for line in lines if line.startswith("event:")), None
        )
        out.append((name, json.loads("\n".join(data))))
    return out


def answer_text(stream: list[tuple[str | None, dict[str, Any]]]) -> str:
    return "".join(
        data["delta"]["text"]
        for name, data in stream
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    )


# ---- Claude Code: Anthropic Messages --------------------------------------------------------


def test_claude_code_s_session_is_served(agents: str) -> None:
    """Its first request as captured (thinking adaptive, output_config, context_management,
    metadata, cache_control, 12 tools), then its next turn with a system message among the
    messages (what 2.1.197 got a 400 for), which reuses the first's prefix."""
    (card,) = [m for m in httpx.get(f"{agents}/v1/models").json()["data"] if m["id"] == AGENT]
    assert card["context_length"] == 32768
    capture = captured("claude-code-2.1.332.json")
    first = send(agents, capture, max_tokens=8)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"].startswith("text/event-stream")
    assert OMITTED_TOOLS_HEADER not in first.headers
    stream = events(first)
    assert [name for name, _ in stream][:2] == ["message_start", "ping"]
    assert stream[-1][0] == "message_stop"
    prompt = stream[0][1]["message"]["usage"]["input_tokens"]
    assert 15_000 < prompt < 25_000

    said = answer_text(stream) or "Hello."
    messages = [
        *capture["body"]["messages"],
        {"role": "assistant", "content": [{"type": "text", "text": said}]},
        {"role": "system", "content": "<system-reminder>Keep answers short.</system-reminder>"},
        {"role": "user", "content": "Say it again."},
    ]
    second = send(agents, capture, max_tokens=8, stream=False, messages=messages)
    assert second.status_code == 200, second.text
    usage = second.json()["usage"]
    assert usage["cache_read_input_tokens"] > prompt - 100
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > prompt


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_claude_code_compacts_on_what_a_small_context_answers(agents: str, stream: bool) -> None:
    """Anthropic's 400: invalid_request_error, `prompt is too long: N tokens > M maximum`,
    the text Claude Code matches (and the counts it reads to know how much to drop)."""
    response = send(agents, captured("claude-code-2.1.332.json"), model=SMALL, stream=stream)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    found = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
    assert found is not None, body
    tokens, maximum = int(found[1]), int(found[2])
    assert maximum == SMALL_CONTEXT - 1 and 15_000 < tokens < 25_000


# ---- Codex: Responses -------------------------------------------------------------------


def test_codex_s_first_request_is_served(agents: str) -> None:
    """A namespace of sub-agent tools and web_search among its tools, developer messages,
    reasoning, include, client_metadata, store false: 200, web_search named as left out."""
    response = send(agents, captured("codex-0.171.0.json"), max_output_tokens=8)
    assert response.status_code == 200, response.text
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search"
    stream = events(response)
    numbers = [data["sequence_number"] for _, data in stream]
    assert numbers == list(range(1, len(stream) + 1))
    assert stream[0][0] == "response.created"
    assert stream[-1][0] in ("response.completed", "response.incomplete")
    final = stream[-1][1]["response"]
    assert 5_000 < final["usage"]["input_tokens"] < 20_000


def test_codex_compacts_on_what_a_small_context_answers(agents: str) -> None:
    """Streamed, as Codex asks: the stream starts, then response.failed whose error code is
    context_length_exceeded (what Codex turns into ContextWindowExceeded); an `error` event
    before it carries the same for clients that read that. Not streamed: OpenAI's 400."""
    capture = captured("codex-0.171.0.json")
    response = send(agents, capture, model=SMALL)
    assert response.status_code == 200, response.text
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search"
    stream = events(response)
    assert [name for name, _ in stream] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert stream[2][1]["code"] == "context_length_exceeded"
    failed = stream[3][1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "context_length_exceeded"
    assert "exceeds the context window" in failed["error"]["message"]

    plain = send(agents, capture, model=SMALL, stream=False)
    assert plain.status_code == 400, plain.text
    error = plain.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("Your input exceeds the context window of this model")


# ---- OpenCode: Chat Completions -----------------------------------------------------------


def test_opencode_s_first_request_is_served(agents: str) -> None:
    response = send(agents, captured("opencode-1.18.33.json"), max_tokens=8)
    assert response.status_code == 200, response.text
    assert OMITTED_TOOLS_HEADER not in response.headers
    chunks = [data for _, data in events(response)]
    assert chunks[0]["model"] == AGENT
    assert any(chunk["choices"] and chunk["choices"][0]["finish_reason"] for chunk in chunks)
    assert chunks[-1]["usage"]["prompt_tokens"] > 5_000


def test_opencode_compacts_on_what_a_small_context_answers(agents: str) -> None:
    response = send(agents, captured("opencode-1.18.33.json"), model=SMALL)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    # OpenCode builds its message from the status text and the body, then matches it.
    message = f"Bad Request: {response.text}"
    assert any(re.search(pattern, message, re.I) for pattern in OPENCODE_OVERFLOW)


# ---- cut-down shapes ---------------------------------------------------------------------


def _codex_tool(name: str) -> dict[str, Any]:
    return next(
        tool for tool in captured("codex-0.171.0.json")["body"]["tools"] if tool.get("name") == name
    )


APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "*** Begin Patch" LF hunk+ "*** End Patch"',
    },
}


def responses(base_url: str, **body: Any) -> httpx.Response:
    payload = {"model": AGENT, "max_output_tokens": 40, "temperature": 0, **body}
    return httpx.post(f"{base_url}/v1/responses", json=payload, timeout=TIMEOUT)


def test_a_namespaced_function_is_offered_and_its_call_names_the_namespace(agents: str) -> None:
    tools = [
        _codex_tool("multi_agent_v1"),
        {"type": "web_search", "external_web_access": False},
        {"type": "local_shell"},
        APPLY_PATCH,
    ]
    forced = {"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"}
    response = responses(agents, input="Close agent a1.", tools=tools, tool_choice=forced)
    assert response.status_code == 200, response.text
    assert response.headers[OMITTED_TOOLS_HEADER] == "web_search,local_shell"
    (call,) = [item for item in response.json()["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("close_agent", "multi_agent_v1")
    assert "target" in json.loads(call["arguments"])


def test_a_custom_tool_call_comes_back_as_one_and_its_output_is_taken(agents: str) -> None:
    forced = {"type": "custom", "name": "apply_patch"}
    response = responses(
        agents, input="Add a line to a.txt.", tools=[APPLY_PATCH], tool_choice=forced, stream=True
    )
    assert response.status_code == 200, response.text
    stream = events(response)
    names = [name for name, _ in stream]
    assert "response.function_call_arguments.delta" not in names
    done = next(data for name, data in stream if name == "response.custom_tool_call_input.done")
    item = next(
        data["item"]
        for name, data in stream
        if name == "response.output_item.done" and data["item"]["type"] == "custom_tool_call"
    )
    assert item["name"] == "apply_patch" and item["call_id"].startswith("call_")
    assert isinstance(item["input"], str) and item["input"] == done["input"]

    # The next turn, as Codex sends it: the call, its output, and a shell call's too.
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        item,
        {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "Done."},
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "call_shell",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "call_shell", "output": "a.txt"},
        {"type": "compaction", "encrypted_content": "opaque"},
    ]
    follow = responses(agents, input=history, tools=[APPLY_PATCH], max_output_tokens=4)
    assert follow.status_code == 200, follow.text


def test_claude_code_s_fields_follow_the_rule(
    agents: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Ignored fields pass silently, an unknown one is logged once, a server tool is left out
    (header, one warning), a field that would change the answer is a 400."""
    caplog.set_level(logging.INFO, logger="kronk_api.client_extras")
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        ],
        "tools": [
            {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "xhigh"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "u"},
        "cache_control": {"type": "ephemeral"},
        "frobnicate": {"level": 3},
    }
    for _ in range(2):
        response = httpx.post(f"{agents}/v1/messages", json=body, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        assert response.headers[OMITTED_TOOLS_HEADER] == "web_search_20250305"
    lines = [record.getMessage() for record in caplog.records]
    assert sum("'frobnicate'" in line for line in lines) == 1
    assert sum("'web_search_20250305'" in line for line in lines) == 1
    assert not any("context_management" in line or "metadata" in line for line in lines)
    warned = [record for record in caplog.records if "web_search_20250305" in record.getMessage()]
    assert warned[0].levelno == logging.WARNING

    refused = {**body, "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}
    response = httpx.post(f"{agents}/v1/messages", json=refused, timeout=TIMEOUT)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "mcp_servers: remote MCP servers are not supported"
    )


def test_responses_fields_follow_the_rule(agents: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kronk_api.client_extras")
    extras = {
        "prompt_cache_key": "k",
        "client_metadata": {"thread_id": "t"},
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "xhigh", "summary": "auto"},
        "text": {"verbosity": "low"},
        "frobnicate_too": True,
    }
    for _ in range(2):
        response = responses(agents, input="Hi", max_output_tokens=2, **extras)
        assert response.status_code == 200, response.text
        assert OMITTED_TOOLS_HEADER not in response.headers
    lines = [record.getMessage() for record in caplog.records]
    assert sum("'frobnicate_too'" in line for line in lines) == 1
    assert not any("prompt_cache_key" in line or "include" in line for line in lines)
    refused = responses(agents, input="Hi", prompt={"id": "pmpt_1"})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("prompt: stored prompt templates")


def test_output_config_format_constrains_the_answer(agents: str) -> None:
    schema = {
        "type": "object",
        "properties": {"greeting": {"type": "string", "maxLength": 12}},
        "required": ["greeting"],
        "additionalProperties": False,
    }
    body = {
        "model": AGENT,
        "max_tokens": 40,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Greet me in JSON."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    response = httpx.post(f"{agents}/v1/messages", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    (block,) = response.json()["content"]
    assert set(json.loads(block["text"])) == {"greeting"}
