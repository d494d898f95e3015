"""The first request of a session of Cline and Open WebUI, in the shape each client sends
it: Cline's long system prompt that describes its tools in the prompt itself, streaming, the
model name the client insists on. Their text is made up; their sizes are the clients' (15-20k
tokens of prompt for Cline). Claude Code's, Codex's and OpenCode's first requests are not
made up: they are captured from the pinned clients (tests/data/agents,
scripts/capture_agent_requests.py)."""

from __future__ import annotations

from typing import Any

# The tools a coding agent offers on its first request, with what each takes.
TOOLS: dict[str, dict[str, str]] = {
    "Task": {"description": "what the sub-agent does", "prompt": "the task in full"},
    "Bash": {"command": "the command to run", "timeout": "milliseconds, at most 600000"},
    "Glob": {"pattern": "the glob to match", "path": "the folder to search"},
    "Grep": {"pattern": "a regular expression", "path": "where to search", "glob": "files"},
    "LS": {"path": "an absolute path"},
    "Read": {"file_path": "an absolute path", "offset": "first line", "limit": "lines"},
    "Edit": {"file_path": "an absolute path", "old_string": "text", "new_string": "text"},
    "MultiEdit": {"file_path": "an absolute path", "edits": "the edits, in order"},
    "Write": {"file_path": "an absolute path", "content": "the whole file"},
    "NotebookEdit": {"notebook_path": "a notebook", "cell_id": "a cell", "new_source": "code"},
    "WebFetch": {"url": "a URL", "prompt": "what to look for on the page"},
    "WebSearch": {"query": "what to search for", "allowed_domains": "domains to keep"},
    "TodoWrite": {"todos": "the whole list, each with content, status and id"},
    "BashOutput": {"bash_id": "a background shell", "filter": "a regular expression"},
    "KillShell": {"shell_id": "the shell to stop"},
    "ExitPlanMode": {"plan": "the plan, in Markdown"},
}

_RULES = [
    "Read a file before you edit it, and keep its indentation and style exactly.",
    "Prefer editing an existing file to writing a new one; never create documentation unasked.",
    "Run the project's tests and linters after a change and fix what they report.",
    "Quote paths that contain spaces, and use absolute paths rather than changing directory.",
    "Never commit, push or rewrite history unless the user asks for it in so many words.",
    "Keep answers short: a line or two unless the user asks for detail or the task needs it.",
    "When a search is open-ended, delegate it to a sub-agent to keep the context small.",
    "Explain a destructive command before you run it, and what it will change.",
]


def _prose(topic: str, paragraphs: int) -> str:
    """Guidelines as the clients write them: numbered rules under a topic, many times over."""
    lines = []
    for number in range(paragraphs):
        rule = _RULES[number % len(_RULES)]
        lines.append(
            f"{topic} guideline {number + 1}: {rule} This applies to step {number + 1} of a "
            f"task as much as to the first; if guideline {number + 1} conflicts with an "
            "explicit instruction of the user, the user's instruction wins."
        )
    return "\n".join(lines)


def _schema(tool: str) -> dict[str, Any]:
    fields = TOOLS[tool]
    return {
        "type": "object",
        "properties": {
            name: {"type": "string", "description": text} for name, text in fields.items()
        },
        "required": list(fields)[:1],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


def _tool_description(tool: str) -> str:
    return f"The {tool} tool.\n\nUsage notes:\n" + _prose(tool, 11)


def cline(model: str) -> dict[str, Any]:
    """POST /v1/chat/completions from Cline's OpenAI Compatible provider: one long system prompt
    that describes its tools in the prompt itself, a task with the environment's details, no
    max_tokens, temperature 0."""
    tool_text = "\n\n".join(
        f"## {tool}\nDescription: {_tool_description(tool)}\nParameters:\n"
        + "\n".join(f"- {name}: (required) {text}" for name, text in fields.items())
        for tool, fields in TOOLS.items()
    )
    return {
        "model": model,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {
                "role": "system",
                "content": "You are Cline, a highly skilled software engineer.\n\nTOOL USE\n\n"
                + tool_text
                + "\n\nRULES\n\n"
                + _prose("Cline", 90),
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "<task>\nRename the function parse to parse_line.\n</task>",
                    },
                    {
                        "type": "text",
                        "text": "<environment_details>\n# Current Working Directory "
                        "(/home/me/project) Files\nsrc/\ntests/\nREADME.md\n"
                        "</environment_details>",
                    },
                ],
            },
        ],
    }


def open_webui(model: str) -> dict[str, Any]:
    """POST /v1/chat/completions from Open WebUI's chat: the conversation and `stream`, nothing
    else (no max_tokens)."""
    return {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "What can you help me with?"}],
    }
