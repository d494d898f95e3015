"""Agentic conversations driven over HTTP, the same way against any OpenAI-compatible server.

A coding agent's request: a long system prompt with its tool descriptions (the same for
every agent of one tool), a growing history, a tool result of a few hundred tokens per
turn, and a short greedy reply that goes back into the history as generated.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

Messages = list[dict[str, str]]

_TOOLS = [
    ("read_file", "Read a file of the workspace", {"path": "string", "start_line": "integer"}),
    ("write_file", "Replace a file's content", {"path": "string", "content": "string"}),
    ("apply_diff", "Apply a unified diff to a file", {"path": "string", "diff": "string"}),
    ("list_files", "List the files under a folder", {"path": "string", "recursive": "boolean"}),
    ("search_files", "Regex search over files", {"path": "string", "regex": "string"}),
    ("run_command", "Run a shell command in the workspace", {"command": "string"}),
    ("ask_followup", "Ask the user a question", {"question": "string"}),
    ("attempt_completion", "Report the task as done", {"result": "string"}),
]

_RULES = [
    "Read a file before you change it, and change only what the task needs.",
    "Run the tests after every change and report their output faithfully.",
    "Prefer small diffs; keep the project's style, names and formatting.",
    "Never print secrets, keys or tokens, even when a file contains them.",
    "When a command fails, read its error and fix the cause before retrying.",
    "Explain each step in one short sentence before calling a tool.",
]


def system_prompt(sections: int = 3) -> str:
    """About 1,100 tokens on the default model: role, rules, tool descriptions."""
    tools = "\n".join(
        json.dumps(
            {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": kind} for key, kind in params.items()},
                    "required": list(params),
                },
            }
        )
        for name, description, params in _TOOLS
    )
    rules = "\n".join(
        f"{section}.{number} {rule}"
        for section in range(1, sections + 1)
        for number, rule in enumerate(_RULES, 1)
    )
    return (
        "You are a careful software engineering agent working in the user's repository.\n"
        f"Rules:\n{rules}\n\nTools (call one per reply as JSON):\n{tools}\n\n"
        f"Examples of good tool calls:\n{tools}\n"
    )


def tool_result(agent: int, turn: int) -> str:
    """About 250 tokens: a listing and a snippet, different for every agent and turn."""
    rng = random.Random(agent * 1000 + turn)
    lines = [
        f"src/pkg{agent}/mod_{turn}_{i}.py  {rng.randint(20, 400)} lines  "
        f"modified {rng.randint(1, 28)} days ago"
        for i in range(6)
    ]
    code = [
        f"def handler_{turn}_{i}(value: int) -> int:\n    return value * {rng.randint(2, 99)} "
        f"+ {rng.randint(0, 9)}"
        for i in range(5)
    ]
    return (
        f"[tool result for call {turn} of agent {agent}]\n" + "\n".join(lines) + "\n\n"
        + "\n".join(code) + "\nWhat is the next step?"
    )


def unique_text(seed: int, words: int) -> str:
    """Filler text no cache has seen (a cold prompt)."""
    rng = random.Random(seed)
    vocabulary = [
        "river", "stone", "garden", "lantern", "orbit", "signal", "harbour", "meadow", "copper",
        "violet", "engine", "summit", "thread", "canvas", "pepper", "marble", "falcon", "glacier",
    ]
    return " ".join(f"{rng.choice(vocabulary)}{rng.randint(0, 999)}" for _ in range(words))


@dataclass
class Turn:
    """One streamed request as the client saw it."""

    ttft: float
    wall: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    reply: str = ""
    error: str = ""


@dataclass
class Client:
    base_url: str
    model: str
    max_tokens: int = 24
    timeout: float = 3600.0
    extra: dict[str, Any] = field(default_factory=dict)

    async def turn(self, http: httpx.AsyncClient, messages: Messages) -> Turn:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra,
        }
        started = time.perf_counter()
        first = last = 0.0
        parts: list[str] = []
        usage: dict[str, Any] = {}
        async with http.stream(
            "POST", f"{self.base_url}/v1/chat/completions", json=body, timeout=self.timeout
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                now = time.perf_counter() - started
                return Turn(now, now, 0, 0, 0, error=f"{response.status_code} {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    if text:
                        last = time.perf_counter() - started
                        first = first or last
                        parts.append(delta.get("content") or "")
        wall = time.perf_counter() - started
        details = usage.get("prompt_tokens_details") or {}
        return Turn(
            ttft=first or wall,
            wall=wall,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            first_token_at=first,
            last_token_at=last,
            reply="".join(parts),
        )

    async def agent(
        self, http: httpx.AsyncClient, index: int, turns: int, system: str
    ) -> list[tuple[Messages, Turn]]:
        """One agent's conversation; returns each turn's messages and what came back."""
        messages: Messages = [{"role": "system", "content": system}]
        done = []
        for number in range(turns):
            messages.append({"role": "user", "content": tool_result(index, number)})
            result = await self.turn(http, messages)
            done.append((list(messages), result))
            messages.append({"role": "assistant", "content": result.reply})
        return done

    async def agents(
        self, count: int, turns: int, system: str, *, distinct: bool = False
    ) -> tuple[float, list[list[tuple[Messages, Turn]]]]:
        """`count` agents at once; returns the wall time and every agent's turns.

        `distinct`: each agent its own system prompt (agents of different tools); else
        all share one (sub-agents of one tool). Agent i's tool results are the same in
        every workload, so its conversations there begin alike."""
        async with _client(count, self.timeout) as http:
            began = time.perf_counter()
            runs = await asyncio.gather(
                *(
                    self.agent(http, index, turns, f"[agent {index}]\n{system}" if distinct
                               else system)
                    for index in range(count)
                )
            )  # fmt: skip
            return time.perf_counter() - began, list(runs)

    async def single(self, messages: Messages, max_tokens: int) -> Turn:
        async with _client(1, self.timeout) as http:
            saved, self.max_tokens = self.max_tokens, max_tokens
            try:
                return await self.turn(http, messages)
            finally:
                self.max_tokens = saved


def _client(connections: int, timeout: float) -> httpx.AsyncClient:
    # A connection per request: llama-server (cpp-httplib) closes a kept-alive
    # connection after a few requests, and a request sent on it as it closes fails.
    limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=0)
    return httpx.AsyncClient(limits=limits, timeout=timeout)
