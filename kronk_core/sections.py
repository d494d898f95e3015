"""Plugin-owned settings sections: declared by plugins, validated by the core.

A plugin declares pydantic models for its own section of the server settings
and of each model's entry (`kronk_settings` hook). The section's key is its
name, by convention the plugin's name:

    models:
      m1:
        context_window: 8192      # core key
        llamacpp:                 # the llamacpp plugin's section
          flash_attention: enabled

Until the plugins are known, a section is kept as the raw mapping; binding
validates each one with its plugin's model and names the offending key in
errors (`models.m1.llamacpp.flash_attention: ...`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pluggy
from pydantic import BaseModel, ValidationError

from kronk_core.errors import ConfigError
from kronk_core.registry import each_plugin

S = TypeVar("S", bound=BaseModel)
SectionT = TypeVar("SectionT", bound="Section[Any]")


def config_error_from(exc: ValidationError, prefix: str = "") -> ConfigError:
    """Turn pydantic's report into a ConfigError that names the offending key."""
    first = exc.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if prefix:
        key = f"{prefix}.{key}" if key else prefix
    message = str(first["msg"]).removeprefix("Value error, ")
    return ConfigError(key or "config", message)


class Sectioned(Protocol):
    """Settings that carry plugin sections: a server's settings, a model's entry."""

    sections: dict[str, Any]

    def section_key(self, name: str) -> str:
        """The dotted key errors give for section `name` (`models.m1.llamacpp`)."""
        ...


@dataclass(frozen=True, eq=False)
class Section(Generic[S]):
    """One plugin's settings section: its key and the pydantic model that validates it."""

    name: str
    schema: type[S]

    def read(self, owner: Sectioned, value: Any) -> S:
        """Validate `value` as this section of `owner`; errors name the key.

        The validator's context holds `owner` (the core settings around the
        section, already validated), so a field can be checked against a core key.
        """
        if isinstance(value, self.schema):
            return value
        key = owner.section_key(self.name)
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a mapping of settings, got {value!r}")
        try:
            return self.schema.model_validate(dict(value or {}), context={"owner": owner})
        except ValidationError as exc:
            raise config_error_from(exc, key) from None

    def of(self, owner: Sectioned) -> S:
        """This section's settings in `owner` (its defaults when the section is absent)."""
        return self.read(owner, owner.sections.get(self.name))


class ModelSection(Section[S]):
    """A section of each model's entry (`models.<id>.<name>`)."""


class ServerSection(Section[S]):
    """A section of the server settings (`<name>`, flags `--<name>-<field>`)."""


def declared_sections(
    manager: pluggy.PluginManager, kind: type[SectionT], reserved: set[str]
) -> dict[str, tuple[str, SectionT]]:
    """The settings sections of one kind (model or server) the active plugins declare.

    Keyed by section name, with the declaring plugin. Two plugins may not
    declare the same name, nor a name the core uses for its own key.
    """
    found: dict[str, tuple[str, SectionT]] = {}
    for plugin, sections in each_plugin(manager.hook.kronk_settings):
        for section in sections or ():
            if not isinstance(section, kind):
                continue
            if section.name in reserved:
                raise ConfigError(section.name, f"plugin {plugin} declares a core key as a section")
            if section.name in found:
                other = found[section.name][0]
                raise ConfigError(section.name, f"declared by both plugins {other} and {plugin}")
            found[section.name] = (plugin, section)
    return found


def bind(
    owner: Sectioned,
    declared: Iterable[Section[Any]],
    inactive: Iterable[str] = (),
) -> dict[str, Any]:
    """Every declared section of this kind validated; an undeclared one is an error.

    A section no active plugin declares may belong to a plugin that is
    installed but disabled (`inactive`), or to none: either way it is refused
    rather than ignored, as ignoring e.g. `auth-jwt: {enabled: true}` would
    serve an open server that looks secured.
    """
    sections = {section.name: section for section in declared}
    disabled = set(inactive)
    for name in owner.sections:
        if name not in sections:
            why = "is disabled" if name in disabled else "is not installed"
            raise ConfigError(
                owner.section_key(name),
                f"no active plugin reads this section (a plugin named {name!r} {why})",
            )
    return {name: section.of(owner) for name, section in sections.items()}


def gather(data: dict[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Split raw settings into known keys and plugin sections (`sections`).

    A key that is not a known one and holds a mapping is a plugin section;
    anything else unknown is left for pydantic to reject with its name.
    """
    fields = set(known)
    sections = dict(data.get("sections") or {})
    kept: dict[str, Any] = {}
    for key, value in data.items():
        if key == "sections":
            continue
        if key in fields or not isinstance(value, Mapping):
            kept[key] = value
        else:
            sections[key] = dict(value)
    kept["sections"] = sections
    return kept
