"""Render chat templates in a jinja2 sandbox."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from importlib.resources import files
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kronk_core.contract.templates import OutputParser, RenderOptions
from kronk_core.errors import ConfigError, TemplateError
from kronk_core.types import ChatMessage, StructuredOutput, ToolChoice, ToolSpec
from kronk_templates.formats import ToolFormat, reasoning_opened

BUNDLED = ("gemma", "chatml", "llama3")
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
    ) -> None:
        self.name = name
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
        if options.tools and not self.renders_tools:
            prompt = tools_prompt(options.tools, self._format.call_example)
            context["messages"] = _with_tools_prompt(context["messages"], prompt)
        elif options.tools:
            context["tools"] = [
                {"type": "function", "function": _function(tool)} for tool in options.tools
            ]
        try:
            return self._template.render(context)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise TemplateError(f"chat template {self.name!r} failed: {exc}") from None

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
