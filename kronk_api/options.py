"""Command-line options derived from the settings: one flag and one KRONK_* variable each.

The names come from `flag_name` and `env_name` (kronk_api.settings); the
variables are read here, not by click, so that another spelling (the manual's,
or a deprecated one, with a warning) still works and never beats the rule's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from kronk_api.settings import (
    OtherSpelling,
    Setting,
    all_settings,
    env_name,
    environment_values,
    flag_name,
    nest,
    other_spellings,
    server_sections,
    split_list,
)
from kronk_core.contract.kronk_view import PluginManager
from kronk_core.contract.plugins import create_plugin_manager
from kronk_core.settings import spellings
from kronk_core.settings.sections import warn_deprecated

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def cli_plugins() -> PluginManager:
    """The command line's plugin manager (selected by KRONK_PLUGINS / KRONK_DISABLE_PLUGINS)."""
    return create_plugin_manager()


def _param_name(key: str) -> str:
    return "setting__" + key.replace("-", "_").replace(".", "__")


def _other(old: str) -> str:
    return "other__" + old


def _help(setting: Setting) -> str:
    default = setting.default_text()
    shown = f" [{default}]" if default else ""
    return f"{setting.field.description or ''}{shown} (env {setting.env})"


def _option(flag: str, name: str, setting: Setting, *, hidden: bool = False) -> click.Option:
    """A string option (pydantic converts it, as it does a variable), or a --x/--no-x switch."""
    if setting.is_bool:
        flag = f"{flag}/--no-{flag.removeprefix('--')}"
        return click.Option([flag, name], default=None, help=_help(setting), hidden=hidden)
    return click.Option(
        [flag, name], default=None, help=_help(setting), hidden=hidden, metavar=setting.metavar
    )


class ServerStartCommand(click.Command):
    """`kronk server start`: an option for every core setting and every plugin section's field.

    The plugins' sections are known only once the plugin manager exists, so
    the options are made when click first asks for them.
    """

    @functools.cached_property
    def schema(self) -> list[Setting]:
        return all_settings(server_sections(cli_plugins()))

    @functools.cached_property
    def others(self) -> list[OtherSpelling]:
        return other_spellings(server_sections(cli_plugins()))

    @functools.cached_property
    def _settings_params(self) -> list[click.Option]:
        options = [
            _option(setting.flag, _param_name(setting.key), setting) for setting in self.schema
        ]
        known = {setting.key: setting for setting in self.schema}
        for other in self.others:
            if other.key in known:
                flag = flag_name(other.name)
                options.append(_option(flag, _other(other.name), known[other.key], hidden=True))
        return options

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        return [*params[:-1], *self._settings_params, params[-1]]  # --help stays last

    def overrides(
        self, params: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Settings from the environment (`environ`, else the process's), then the flags given."""
        values = environment_values(
            self.schema, os.environ if environ is None else environ, self.others
        )
        flags = {
            setting.key: params[_param_name(setting.key)]
            for setting in self.schema
            if params.get(_param_name(setting.key)) is not None
        }
        for other in self.others:
            value = params.get(_other(other.name))
            if value is not None and other.key not in flags:
                if other.deprecated:
                    warn_deprecated(flag_name(other.name), flag_name(other.key))
                flags[other.key] = value
        known = {setting.key: setting for setting in self.schema}
        values.update(
            {
                key: split_list(value) if known[key].is_list else value
                for key, value in flags.items()
            }
        )
        return nest(values)


# A settings file for the commands that read the server settings (server start, mcp start).
config_file_option = click.option(
    "--config",
    "config_file",
    envvar="KRONK_CONFIG",
    type=click.Path(path_type=Path),
    help="YAML file with server settings (flags and environment override it)",
)


def setting_option(
    key: str, *, others: Iterable[OtherSpelling] = (), **kwargs: Any
) -> Callable[[F], F]:
    """An option for the setting `key` on any command, named by the rule.

    Its value comes from the flag, else the variable; the setting's other spellings
    (`others`, a section's flat keys; the manual's variables of core keys) still work when
    the rule's are not given, a deprecated one with a warning. The parameter's name is the
    key with `_` for `-` and `.`.
    """
    name = key.replace("-", "_").replace(".", "_")
    mine = [other for other in others if other.key == key]
    old_variables = [
        (variable, False) for variable, new in spellings.SERVER_ENVIRONMENT.items() if new == key
    ]
    old_variables += [(env_name(other.name), other.deprecated) for other in mine]
    deprecated_flags = {flag_name(other.name) for other in mine if other.deprecated}

    def remember_other(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            if param.opts[0] in deprecated_flags:
                warn_deprecated(param.opts[0], flag_name(key))
            ctx.meta[f"kronk.other.{key}"] = value

    def resolve(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            value = ctx.meta.get(f"kronk.other.{key}")
        if value is not None:
            return value
        text = os.environ.get(env_name(key))
        for variable, deprecated in old_variables:
            if text is None and variable in os.environ:
                if deprecated:
                    warn_deprecated(variable, env_name(key))
                text = os.environ[variable]
        return None if text is None else param.type_cast_value(ctx, text)

    kwargs["help"] = f"{kwargs.get('help', '')} (env {env_name(key)})"
    decorators = [click.option(flag_name(key), name, callback=resolve, **kwargs)]
    decorators += [
        # Eager: processed before the current option, which falls back on it.
        click.option(
            flag_name(other.name),
            _other(other.name),
            callback=remember_other,
            expose_value=False,
            is_eager=True,
            hidden=True,
            type=kwargs.get("type"),
        )
        for other in mine
    ]

    def decorate(command: F) -> F:
        for decorator in decorators:
            command = decorator(command)
        return command

    return decorate


def add_server_start_option(group: click.Group, option: click.Option) -> None:
    """Give `kronk server start` an option of a plugin's (from its kronk_cli hook): the
    manual's flags that set a variable of the process, such as `--processor`."""
    server = group.commands.get("server")
    start = server.commands.get("start") if isinstance(server, click.Group) else None
    if start is not None:
        start.params.append(option)
