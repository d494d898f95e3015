"""The UI's built-in documentation (the manual's chapter 12.5): the command-line reference
and the SDK's reference, read from the code itself so that they never drift from it."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import click
from litestar import get

from kronk_api.contract import ENDPOINT_OPT, PUBLIC
from kronk_core import Kronk
from kronk_core.contract import ModelDirectory


def _first_paragraph(text: str | None) -> str:
    return (text or "").strip().split("\n\n")[0].replace("\n", " ")


def _flags(option: click.Option) -> str:
    names = [", ".join(option.opts)]
    if option.secondary_opts:
        names.append(", ".join(option.secondary_opts))
    return " / ".join(names)


def _commands(command: click.Command, path: list[str], ctx: click.Context) -> list[dict[str, Any]]:
    """Every command under `command`, its help and its visible options, depth first."""
    found: list[dict[str, Any]] = []
    if not isinstance(command, click.Group) or command.invoke_without_command:
        options = [
            {"flags": _flags(param), "help": param.help or ""}
            for param in command.get_params(ctx)
            if isinstance(param, click.Option) and not param.hidden and "--help" not in param.opts
        ]
        arguments = [
            param.name.upper()
            for param in command.params
            if isinstance(param, click.Argument) and param.name
        ]
        found.append(
            {
                "command": " ".join([*path, *arguments]),
                "help": _first_paragraph(command.help),
                "options": options,
            }
        )
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _commands(
                    sub, [*path, name], click.Context(sub, parent=ctx, info_name=name)
                )
    return found


@functools.cache
def cli_reference() -> list[dict[str, Any]]:
    from kronk_api.contract import main

    return _commands(main, ["kronk"], click.Context(main, info_name="kronk"))


def _signature(method: Any) -> str:
    """Its parameters after `self`, annotations as written (not as quoted strings)."""
    signature = inspect.signature(method)
    parameters = [
        parameter.replace(annotation=_written(parameter.annotation))
        for parameter in list(signature.parameters.values())[1:]
    ]
    returns = _written(signature.return_annotation)
    return str(signature.replace(parameters=parameters, return_annotation=returns))


class _Written:
    """An annotation kept as the text it was written as (postponed annotations are strings)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _written(annotation: Any) -> Any:
    return _Written(annotation) if isinstance(annotation, str) else annotation


@functools.cache
def sdk_reference() -> list[dict[str, Any]]:
    """Kronk's public methods and its model directory's (`models.`): signature and docstring."""
    return [
        {
            "name": name,
            "signature": f"{name}{_signature(member)}",
            "doc": inspect.getdoc(member) or "",
            "async": inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member),
        }
        for prefix, owner in (("", Kronk), ("models.", ModelDirectory))
        for own_name, member in inspect.getmembers(owner, inspect.isfunction)
        if not own_name.startswith("_")
        for name in (prefix + own_name,)
    ]


@get("/v1/kronk/ui/reference", opt={ENDPOINT_OPT: PUBLIC}, sync_to_thread=True)
def reference() -> dict[str, Any]:
    """The CLI and SDK reference the browser UI's reference page shows."""
    return {"cli": cli_reference(), "sdk": sdk_reference()}
