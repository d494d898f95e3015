"""Boolean flags that also take a value: `--preload=true`, `--auth-enabled=0`, `--local=yes`.

The Kronk manual writes its switches both ways (`--insecure-logging=true`, `-d`); click's
flags take no value. `BoolValueGroup` rewrites `--flag=VALUE` into the flag's own switch
(`--flag`, `--no-flag`, or nothing for a plain flag set false) before the command parses
its arguments, so every boolean flag of every command takes a value, a plugin's included:
the sub-groups of one are BoolValueGroups too (`group_class`), and a plugin makes its own
groups with `cls=BoolValueGroup` (kronk_api.contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import click


def _bool_flags(command: click.Command, ctx: click.Context) -> dict[str, click.Option]:
    """Each long name of a boolean flag (`--x`, `--no-x`) → the flag."""
    found: dict[str, click.Option] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option) and param.is_bool_flag:
            names = [*param.opts, *param.secondary_opts]
            found.update({name: param for name in names if name.startswith("--")})
    return found


def with_switches(command: click.Command, ctx: click.Context, args: Sequence[str]) -> list[str]:
    """`args` with each `--flag=VALUE` of a boolean flag written as its switch.

    VALUE is what click's BOOL reads (true/false, 1/0, yes/no, on/off, t/f, y/n); any
    other is the flag's usage error.
    """
    flags = _bool_flags(command, ctx)
    rewritten: list[str] = []
    for position, arg in enumerate(args):
        if arg == "--":
            rewritten += args[position:]
            break
        name, equals, text = arg.partition("=")
        if not equals or name not in flags:
            rewritten.append(arg)
            continue
        option = flags[name]
        # True: the name as if given alone; false: its opposite (`--x=false` is `--no-x`).
        if click.BOOL.convert(text, option, ctx):
            rewritten.append(name)
        elif name in option.secondary_opts:
            rewritten.append(option.opts[0])
        elif option.secondary_opts:
            rewritten.append(option.secondary_opts[0])
        # else: a plain flag (`--force`) set false is a flag not given.
    return rewritten


class BoolValueGroup(click.Group):
    """A group whose commands' boolean flags take `=VALUE`; its sub-groups are the same."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is None or isinstance(command, click.Group):
            return name, command, rest  # a group rewrites its own commands' arguments
        # The command's own context, so that a bad value's usage line is the command's.
        own = click.Context(command, info_name=name, parent=ctx)
        return name, command, with_switches(command, own, rest)


BoolValueGroup.group_class = BoolValueGroup
