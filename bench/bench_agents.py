"""A coding agent's real traffic: Kronk against llama-server, side by side in one run.

Agents are fast when the prompt they all share is prefilled once. Claude Code sends a
~21k-token system prompt and tool list with every request of every session, its main
agent's and its sub-agents' alike; a server that prefills it for each session spends
minutes where a copy takes milliseconds. This measures that on the request Claude Code
really sends (tests/data/agents/claude-code-2.1.332.json), turned into the OpenAI
chat-completions shape both servers speak: its system blocks joined into one system
message (as Kronk's Anthropic dialect joins them), its tools as function tools, its
user text blocks as the main agent's first message.

The workload: one main agent and sub-agents, each sub-agent starting `--stagger`
seconds after the one before with the shared system prompt and tools and a task of its
own. Every session runs `--turns` turns, each after the first adding the last reply (24
greedy tokens, fed back as generated) and a tool result of a few hundred tokens
(bench/agent_load.py's). Then the main agent compacts, as Claude Code does: it asks for
a summary of its conversation, and goes on from a history that is only that summary.

Both servers serve the same model file (Gemma 3 270M) with the same chat template
(Kronk's bundled one, given to llama-server as a file), 4 slots of 32,768 tokens each,
the same warm-up, each alone on 127.0.0.1 (llama-server built by bench/llama_server.py,
its prompt cache on by default). Printed for both: wall time, time to first token
summed, the prompt tokens each server prefilled (its usage: prompt tokens less cached
ones; llama-server's cached count is the prefix it kept after its own checkpoint
restore, so the difference is its `timings.prompt_n`), and for each session the share
of the shared prefix (its tokens counted once, by llama-server's own template and
tokenizer) that it prefilled again. The target: every session after the first
prefills at most 5% of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from agent_load import Client, Messages, Turn, tool_result
from bench_vs_llama_server import free_port, gemma_server_command, running, warm_up
from llama_server import llama_server_binary, no_amx_environment

from kronk_anthropic.schemas import BLOCK_SEPARATOR
from kronk_core.contract.tokens import common_prefix
from kronk_llamacpp.packaged import GEMMA_MODEL_ID

CAPTURE = Path(__file__).parent.parent / "tests" / "data" / "agents" / "claude-code-2.1.332.json"
SLOTS, SLOT_CONTEXT = 4, 32768
REPLY_TOKENS, SUMMARY_TOKENS = 24, 96
TARGET_SHARE = 0.05
SUB_AGENT_TASKS = (
    "Find every module of the project that reads configuration files and list them.",
    "Search the tests for the ones that start a server, and report how they pick a port.",
    "Read the command-line entry point and summarize which options it accepts.",
    "Look for places that catch an exception and ignore it, and list the files.",
)
# What Claude Code asks for when it compacts, and how its next request opens (in spirit).
COMPACT = (
    "Your task is to create a detailed summary of the conversation so far: the user's "
    "requests, the files read and changed, the errors met and how they were fixed, and "
    "the work still pending. Answer with the summary only."
)
CONTINUED = (
    "This session is being continued from a previous conversation that ran out of "
    "context. The conversation is summarized below:\n{summary}\n\nContinue the "
    "conversation from where it left off without asking the user any further questions."
)


@dataclass(frozen=True)
class Workload:
    system: str
    tools: list[dict[str, Any]]
    main_task: str


def load_workload(capture: Path) -> Workload:
    """The captured Anthropic request in the OpenAI chat-completions shape."""
    body = json.loads(capture.read_text(encoding="utf-8"))["body"]
    system = body["system"]
    if isinstance(system, list):
        system = BLOCK_SEPARATOR.join(block["text"] for block in system)
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": tool["input_schema"],
            },
        }
        for tool in body["tools"]
    ]
    content = body["messages"][-1]["content"]
    if isinstance(content, list):
        content = BLOCK_SEPARATOR.join(b["text"] for b in content if b["type"] == "text")
    return Workload(system, tools, content)


@dataclass(frozen=True)
class Request:
    """One request of a session, as the client saw it."""

    session: int
    kind: str  # "first", "tool result", "compaction" or "after compaction"
    turn: Turn


async def session(
    client: Client, workload: Workload, index: int, turns: int, stagger: float
) -> list[Request]:
    """Session 0 is the main agent (it compacts at its end); the others are sub-agents."""
    await asyncio.sleep(index * stagger)
    task = workload.main_task if index == 0 else SUB_AGENT_TASKS[index % len(SUB_AGENT_TASKS)]
    messages: Messages = [
        {"role": "system", "content": workload.system},
        {"role": "user", "content": task},
    ]
    done = [Request(index, "first", await client.single(messages, REPLY_TOKENS))]
    for number in range(1, turns):
        messages += [
            {"role": "assistant", "content": done[-1].turn.reply},
            # A tool's result; the template renders it as a user turn, without its id.
            {
                "role": "tool",
                "tool_call_id": f"call_{number}",
                "content": tool_result(index, number),
            },
        ]
        done.append(Request(index, "tool result", await client.single(messages, REPLY_TOKENS)))
    if index == 0:
        messages += [
            {"role": "assistant", "content": done[-1].turn.reply},
            {"role": "user", "content": COMPACT},
        ]
        summary = await client.single(messages, SUMMARY_TOKENS)
        done.append(Request(index, "compaction", summary))
        messages = [
            {"role": "system", "content": workload.system},
            {"role": "user", "content": CONTINUED.format(summary=summary.reply)},
        ]
        done.append(Request(index, "after compaction", await client.single(messages, REPLY_TOKENS)))
    return done


@dataclass
class Results:
    wall: float
    requests: list[Request]


async def drive(client: Client, workload: Workload, args: argparse.Namespace) -> Results:
    began = time.perf_counter()
    runs = await asyncio.gather(
        *(session(client, workload, index, args.turns, args.stagger)
          for index in range(args.sessions))
    )  # fmt: skip
    return Results(time.perf_counter() - began, [request for run in runs for request in run])


def agent_client(base_url: str, workload: Workload) -> Client:
    return Client(base_url, GEMMA_MODEL_ID, extra={"tools": workload.tools})


def shared_prefix(base_url: str, workload: Workload) -> int:
    """Tokens the sessions' first prompts share (the system prompt and tools, with the
    template's opening), from llama-server's own rendering and tokenizer."""
    prompts = []
    for task in (workload.main_task, *SUB_AGENT_TASKS[:1]):
        messages = [
            {"role": "system", "content": workload.system},
            {"role": "user", "content": task},
        ]
        body = {"messages": messages, "tools": workload.tools}
        text = httpx.post(f"{base_url}/apply-template", json=body, timeout=60).json()["prompt"]
        tokenized = {"content": text, "add_special": False, "parse_special": True}
        prompts.append(httpx.post(f"{base_url}/tokenize", json=tokenized, timeout=60).json())
    return common_prefix(prompts[0]["tokens"], prompts[1]["tokens"])


def run_llama_server(
    log_dir: Path, workload: Workload, args: argparse.Namespace
) -> tuple[Results, int]:
    port = free_port()
    command = gemma_server_command(
        log_dir, port, "-c", str(SLOTS * SLOT_CONTEXT), "-np", str(SLOTS)
    )
    client = agent_client(f"http://127.0.0.1:{port}", workload)
    with running("llama-server", command, f"{client.base_url}/health", log_dir,
                 no_amx_environment()):  # fmt: skip
        asyncio.run(warm_up(client))
        prefix = shared_prefix(client.base_url, workload)
        return asyncio.run(drive(client, workload, args)), prefix


def run_kronk(log_dir: Path, workload: Workload, args: argparse.Namespace) -> Results:
    port = free_port()
    model_config = log_dir / "kronk-models.yaml"
    entry = {GEMMA_MODEL_ID: {"context_window": SLOT_CONTEXT, "n_seq_max": SLOTS}}
    model_config.write_text(json.dumps({"models": entry}), encoding="utf-8")  # JSON is YAML
    command = [
        sys.executable, "-m", "kronk_api.cli", "server", "start",
        "--api-host", f"127.0.0.1:{port}", "--preload", "--base-path", str(log_dir / "kronk"),
        "--model", GEMMA_MODEL_ID, "--model-config-file", str(model_config),
    ]  # fmt: skip
    client = agent_client(f"http://127.0.0.1:{port}", workload)
    with running("kronk", command, f"{client.base_url}/v1/readiness", log_dir):
        asyncio.run(warm_up(client))
        return asyncio.run(drive(client, workload, args))


def _prefilled(request: Request) -> int:
    return request.turn.prompt_tokens - request.turn.cached_tokens


def _prefix_again(requests: list[Request], prefix: int) -> float:
    """The share of the shared prefix these requests prefilled (a request that kept less
    of its prompt than the prefix prefilled the rest of the prefix again)."""
    return sum(max(0, prefix - r.turn.cached_tokens) for r in requests) / prefix


def _row(name: str, llama: float, kronk: float, unit: str) -> None:
    ratio = f"{kronk / llama:.2f}x" if llama else "n/a"
    print(f"{name:<46}{llama:>12.2f}{kronk:>12.2f}{ratio:>9}  ({unit})")


def report(llama: Results, kronk: Results, prefix: int, args: argparse.Namespace) -> None:
    print(f"\nAgents from {CAPTURE.name}: 1 main agent + {args.sessions - 1} sub-agents, "
          f"{args.turns} turns each, starts {args.stagger:g} s apart, one compaction; "
          f"shared prefix (system prompt + tools): {prefix} tokens")  # fmt: skip
    print(f"llama-server: -c {SLOTS * SLOT_CONTEXT} -np {SLOTS} ({SLOTS} x {SLOT_CONTEXT}), "
          "--jinja --chat-template-file (Kronk's gemma), its defaults otherwise (prompt "
          "cache in RAM, context checkpoints), the no-AMX shim")  # fmt: skip
    print(f"kronk: model config context_window {SLOT_CONTEXT}, n_seq_max {SLOTS}, its "
          "defaults otherwise (cache: imc)")  # fmt: skip
    print(f"\n{'figure':<46}{'llama-srv':>12}{'kronk':>12}{'ratio':>9}")
    _row("wall", llama.wall, kronk.wall, "s")
    _row("time to first token, summed", sum(r.turn.ttft for r in llama.requests),
         sum(r.turn.ttft for r in kronk.requests), "s")  # fmt: skip
    _row("prompt tokens prefilled", sum(map(_prefilled, llama.requests)),
         sum(map(_prefilled, kronk.requests)), "tokens")  # fmt: skip
    _row("main agent's first prompt (the same on both)", llama.requests[0].turn.prompt_tokens,
         kronk.requests[0].turn.prompt_tokens, "tokens")  # fmt: skip
    print("\nshare of the shared prefix prefilled again")
    rows = [
        ("session 1 (main agent): all of it, the first", 0, ("first", "tool result")),
        ("session 1 after compaction", 0, ("compaction", "after compaction")),
        *((f"session {index + 1} (sub-agent {index})", index, ("first", "tool result"))
          for index in range(1, args.sessions)),
    ]  # fmt: skip
    later: list[float] = []
    for label, index, kinds in rows:
        shares = [
            _prefix_again([r for r in res.requests if r.session == index and r.kind in kinds],
                          prefix)
            for res in (llama, kronk)
        ]  # fmt: skip
        print(f"{label:<46}{shares[0]:>12.1%}{shares[1]:>12.1%}")
        if index:
            later.append(shares[1])
    failed = [sum(1 for r in results.requests if r.turn.error) for results in (llama, kronk)]
    print(f"{'requests failed':<46}{failed[0]:>12}{failed[1]:>12}")
    worst = max(later)
    met = "met" if worst <= TARGET_SHARE else "NOT met"
    print(f"\nverdict: Kronk's wall time {kronk.wall / llama.wall:.2f}x llama-server's; every "
          f"later session prefilled at most {TARGET_SHARE:.0%} of the shared prefix: {met} "
          f"(worst {worst:.1%})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=4, help="main agent + sub-agents")
    parser.add_argument("--turns", type=int, default=3, help="turns of each session")
    parser.add_argument("--stagger", type=float, default=2.0, help="seconds between starts")
    parser.add_argument("--logs", type=Path, help="keep the server logs here")
    args = parser.parse_args()
    if args.sessions < 2 or args.turns < 1:
        parser.error("--sessions must be at least 2 and --turns at least 1")
    workload = load_workload(CAPTURE)
    llama_server_binary()  # build before anything is timed
    with tempfile.TemporaryDirectory(prefix="kronk-agents-") as scratch:
        log_dir = args.logs or Path(scratch)
        log_dir.mkdir(parents=True, exist_ok=True)
        print("running llama-server ...", flush=True)
        llama, prefix = run_llama_server(log_dir, workload, args)
        print("running kronk ...", flush=True)
        kronk = run_kronk(log_dir, workload, args)
    report(llama, kronk, prefix, args)


if __name__ == "__main__":
    main()
