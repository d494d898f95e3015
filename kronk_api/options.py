"""Command-line options derived from the settings: one flag and one KRONK_* variable each.

The names come from `flag_name` and `env_name` (kronk_api.settings); the
variables are read here, not by click, so that a deprecated name still works,
with a warning, and never beats the current one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from kronk_api.settings import (
    Setting,
    all_settings,
    env_name,
    environment_values,
    flag_name,
    nest,
    server_sections,
    split_list,
)
from kronk_core import legacy
from kronk_core.plugins import PluginManager, create_plugin_manager

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def cli_plugins() -> PluginManager:
    """The command line's plugin manager (selected by KRONK_PLUGINS / KRONK_DISABLE_PLUGINS)."""
    return create_plugin_manager()


def _param_name(key: str) -> str:
    return "setting__" + key.replace("-", "_").replace(".", "__")


def _deprecated(old: str) -> str:
    return "deprecated__" + old


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
    def _settings_params(self) -> list[click.Option]:
        options = [
            _option(setting.flag, _param_name(setting.key), setting) for setting in self.schema
        ]
        known = {setting.key: setting for setting in self.schema}
        for old, new in legacy.SERVER_KEYS.items():
            if new in known:
                options.append(_option(flag_name(old), _deprecated(old), known[new], hidden=True))
        return options

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        return [*params[:-1], *self._settings_params, params[-1]]  # --help stays last

    def overrides(
        self, params: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Settings from the environment (`environ`, else the process's), then the flags given."""
        values = environment_values(self.schema, os.environ if environ is None else environ)
        flags = {
            setting.key: params[_param_name(setting.key)]
            for setting in self.schema
            if params.get(_param_name(setting.key)) is not None
        }
        for old, new in legacy.SERVER_KEYS.items():
            value = params.get(_deprecated(old))
            if value is not None and new not in flags:
                legacy.warn(flag_name(old), flag_name(new))
                flags[new] = value
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


def setting_option(key: str, **kwargs: Any) -> Callable[[F], F]:
    """An option for the setting `key` on any command, named by the rule.

    Its value comes from the flag, else the variable; the setting's deprecated
    flag (hidden) and variables still work, with a warning, when the current
    ones are not given. The parameter's name is the key with `_` for `-` and `.`.
    """
    name = key.replace("-", "_").replace(".", "_")
    old_keys = [old for old, new in legacy.SERVER_KEYS.items() if new == key]
    old_variables = [variable for variable, new in legacy.SERVER_ENVIRONMENT.items() if new == key]
    old_variables += [env_name(old) for old in old_keys]

    def remember_deprecated(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            legacy.warn(param.opts[0], flag_name(key))
            ctx.meta[f"kronk.deprecated.{key}"] = value

    def resolve(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            value = ctx.meta.get(f"kronk.deprecated.{key}")
        if value is not None:
            return value
        text = os.environ.get(env_name(key))
        for variable in old_variables:
            if text is None and variable in os.environ:
                legacy.warn(variable, env_name(key))
                text = os.environ[variable]
        return None if text is None else param.type_cast_value(ctx, text)

    kwargs["help"] = f"{kwargs.get('help', '')} (env {env_name(key)})"
    decorators = [click.option(flag_name(key), name, callback=resolve, **kwargs)]
    decorators += [
        # Eager: processed before the current option, which falls back on it.
        click.option(
            flag_name(old),
            f"deprecated__{old}",
            callback=remember_deprecated,
            expose_value=False,
            is_eager=True,
            hidden=True,
            type=kwargs.get("type"),
        )
        for old in old_keys
    ]

    def decorate(command: F) -> F:
        for decorator in decorators:
            command = decorator(command)
        return command

    return decorate
