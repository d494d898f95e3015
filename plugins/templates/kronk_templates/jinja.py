"""Render chat templates in a jinja2 sandbox."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from importlib.resources import files
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kronk_core.contract import (
    ChatMessage,
    ConfigError,
    OutputParser,
    RenderOptions,
    StructuredOutput,
    TemplateError,
    ToolChoice,
    ToolSpec,
)
from kronk_templates.formats import ToolFormat, reasoning_opened

log = logging.getLogger(__name__)

BUNDLED = ("gemma", "chatml", "llama3")
# Distinct render failures warned about per template; the same one again is logged at debug.
_WARNED_FAILURES = 32
_RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})


def bundled_source(name: str) -> str:
    if name not in BUNDLED:
        raise ConfigError("template", f"unknown template {name!r}; bundled: {', '.join(BUNDLED)}")
    return (files("kronk_templates") / "bundled" / f"{name}.jinja").read_text(encoding="utf-8")


def _raise(message: str) -> None:
    raise TemplateError(f"chat template: {message}")


def _arguments(text: str) -> Any:
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        raise TemplateError("tool call arguments must be JSON text") from None


def _function(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": json.loads(tool.parameters_json),
    }


def tools_prompt(tools: Sequence[ToolSpec], call_example: str) -> str:
    """The tool list for a template that never renders `tools`, and how to call one."""
    signatures = "\n".join(json.dumps(_function(tool), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query. "
        f"Their signatures, one per line:\n{signatures}\n\n"
        f"To call a function, reply with:\n{call_example}"
    )


def _with_tools_prompt(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """The tool list joins the system message, or opens the conversation as one."""
    if messages and messages[0]["role"] in ("system", "developer"):
        first, content = messages[0], messages[0]["content"]
        joined = f"{content}\n\n{prompt}" if content else prompt
        return [{**first, "content": joined}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _message_dict(message: ChatMessage) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name is not None:
        data["name"] = message.name
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        data["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        data["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    return data


_SYSTEM_ROLES = ("system", "developer")
_PROBE_SYSTEM = "Probe: a rule that applies from here on."
# How control tokens are spelled: <|im_start|>, <|start_header_id|>, <start_of_turn>.
_CONTROL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|<[a-z_]{1,40}>")


def _inserted(shorter: str, longer: str) -> str:
    """What `longer` holds beyond `shorter`, between their common prefix and suffix."""
    start = 0
    while start < len(shorter) and shorter[start] == longer[start]:
        start += 1
    end = 0
    while end < len(shorter) - start and shorter[-1 - end] == longer[-1 - end]:
        end += 1
    return longer[start : len(longer) - end]


def _joined(message: dict[str, Any], text: str) -> dict[str, Any]:
    content = message["content"]
    return {**message, "content": f"{content}\n\n{text}" if content else text}


def merge_system_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages after the first turn, for a template that cannot render them where
    they stand: the leading ones become one; a later one joins the user message it follows,
    else the next user message, else becomes a user message of its own. Each keeps its
    place among the turns, so a conversation renders the same prefix turn after turn (what
    the message cache reuses)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # later system text waiting for the next user message
    for message in messages:
        text = message["content"] or ""
        if message["role"] not in _SYSTEM_ROLES:
            if pending and message["role"] == "user":
                message = {**message, "content": "\n\n".join([*pending, text])}
                pending = []
            out.append(message)
        elif not out:
            out.append(message)
        elif out[-1]["role"] == "user" or all(m["role"] in _SYSTEM_ROLES for m in out):
            out[-1] = _joined(out[-1], text)
        else:
            pending.append(text)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


class JinjaTemplateProcessor:
    """Renders with a jinja chat template; parses output with the model's tool-call format."""

    def __init__(
        self,
        name: str,
        source: str,
        bos_token: str,
        eos_token: str,
        tool_format: ToolFormat,
        think: bool,
        fallback: JinjaTemplateProcessor | None = None,
    ) -> None:
        self.name = name
        # What renders a request this template fails on (ChatML, as llama.cpp falls back to).
        self.fallback = fallback
        self._warned: set[str] = set()
        self.special_tokens_as_text = tool_format.special_tokens_as_text
        self._format = tool_format
        self._think = think
        # Plain Undefined, as Hugging Face renders them: templates test `{% if tools %}`.
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
            value, indent=indent, ensure_ascii=False
        )
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = environment.from_string(source)
            variables = jinja2.meta.find_undeclared_variables(environment.parse(source))
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError("template", f"chat template {name!r} does not parse: {exc}") from None
        # Older templates never mention `tools`; Kronk shows their models the tools itself.
        self.renders_tools = "tools" in variables
        self._bos = bos_token
        self._eos = eos_token
        self._system_turns_anywhere: bool | None = None
        self.turn_opener = self._turn_opener()

    def _turn_opener(self) -> str | None:
        """The marker the generation prompt opens the assistant's turn with: what rendering
        with `add_generation_prompt` adds, where it starts with a control token's text."""
        context = {
            "messages": [{"role": "user", "content": "Probe: a question."}],
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        try:
            closed = self._template.render({**context, "add_generation_prompt": False})
            opened = self._template.render({**context, "add_generation_prompt": True})
        except (jinja2.TemplateError, TemplateError, TypeError, ValueError, KeyError):
            return None
        if not opened.startswith(closed):
            return None
        found = _CONTROL_TOKEN.match(opened[len(closed) :])
        return found.group(0) if found else None

    def system_turns_anywhere(self) -> bool:
        """Whether the template renders a system message after the first turn as a turn of
        its own, where it stands: rendered with one and without, the difference holds more
        than its text. A template that raises, drops it or folds it into a neighbouring
        turn (the bundled gemma, Gemma's and Mistral's own) gets such messages merged
        (`merge_system_turns`)."""
        if self._system_turns_anywhere is None:
            turns = [
                {"role": "system", "content": "Probe: the first rule."},
                {"role": "user", "content": "Probe: the first question."},
                {"role": "system", "content": _PROBE_SYSTEM},
                {"role": "assistant", "content": "Probe: the first answer."},
                {"role": "user", "content": "Probe: the second question."},
            ]
            context = {
                "add_generation_prompt": True,
                "bos_token": self._bos,
                "eos_token": self._eos,
            }
            try:
                without = self._template.render({**context, "messages": turns[:2] + turns[3:]})
                inserted = _inserted(without, self._template.render({**context, "messages": turns}))
            except (jinja2.TemplateError, TemplateError, TypeError, ValueError, KeyError):
                inserted = ""  # a template that refuses them cannot render them there
            rest = inserted.replace(_PROBE_SYSTEM, "")
            self._system_turns_anywhere = _PROBE_SYSTEM in inserted and bool(rest.strip())
        return self._system_turns_anywhere

    def render(self, messages: Sequence[ChatMessage], options: RenderOptions) -> str:
        # chat_template_kwargs may set template switches (enable_thinking, ...), not the inputs.
        context: dict[str, Any] = {
            "enable_thinking": options.enable_thinking,
            **{k: v for k, v in options.template_kwargs.items() if k not in _RESERVED},
            "messages": [_message_dict(message) for message in messages],
            "add_generation_prompt": options.add_generation_prompt,
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        if options.reasoning_effort is not None:
            context["reasoning_effort"] = options.reasoning_effort
        later_system = any(
            message.role in _SYSTEM_ROLES and index > 0 for index, message in enumerate(messages)
        )
        if later_system and not self.system_turns_anywhere():
            context["messages"] = merge_system_turns(context["messages"])
        if options.tools and not self.renders_tools:
            prompt = tools_prompt(options.tools, self._format.call_example)
            context["messages"] = _with_tools_prompt(context["messages"], prompt)
        elif options.tools:
            context["tools"] = [
                {"type": "function", "function": _function(tool)} for tool in options.tools
            ]
        try:
            return self._template.render(context)
        except TemplateError as exc:
            failure = str(exc)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            failure = f"chat template {self.name!r} failed: {exc}"
        if self.fallback is None:
            raise TemplateError(failure)
        self._warn(failure, self.fallback.name)
        return self.fallback.render(messages, options)

    def _warn(self, failure: str, fallback: str) -> None:
        """A warning once per kind of failure, then debug: each request would repeat it."""
        level = logging.DEBUG
        if failure not in self._warned and len(self._warned) < _WARNED_FAILURES:
            self._warned.add(failure)
            level = logging.WARNING
        log.log(level, "%s; rendered the request with %s instead", failure, fallback)

    def parser(self, options: RenderOptions, prompt: str) -> OutputParser:
        return self._format.parser(
            tools=options.tools,
            parse_tools=bool(options.tools),
            think=self._think,
            # With thinking off (a grammar, or the caller) what follows an opened
            # block is the answer, even for templates that always open one.
            reasoning_open=self._think and options.enable_thinking and reasoning_opened(prompt),
            new_id=new_call_id,
        )

    def tool_constraint(
        self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool
    ) -> StructuredOutput | str:
        return self._format.constraint(tools, choice, parallel)
