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

A section also declares the other ways its settings are written: the Kronk
manual's flat keys (`n_ubatch: 512` is `llamacpp: {n_ubatch: 512}`), this
project's own moved keys (accepted for one release, with a warning), and yes/no
keys that choose a core key's value (`incremental_cache: true` is `cache: imc`).
Until binding, such a key waits among the raw sections under its own name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import pluggy
from pydantic import BaseModel, ValidationError

from kronk_core.contract.errors import ConfigError
from kronk_core.contract.registry import each_plugin

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Switch:
    """A yes/no key that chooses a core key's value: the manual's `incremental_cache: true`
    is `cache: imc`. Any other value than false (the manual's `draft-model` block) is yes."""

    key: str
    on: str
    # What false chooses, when no other switch of the same key is on.
    off: str | None = None


@dataclass(frozen=True, eq=False)
class Section(Generic[S]):
    """One plugin's settings section: its key and the pydantic model that validates it, and
    the other ways its settings are written at the top of the entry (or server settings)."""

    name: str
    schema: type[S]
    # Other names of the whole section (the manual's `draft-model` block is `speculative`).
    other_names: tuple[str, ...] = ()
    # Flat keys → the field they set: the Kronk manual's spellings, accepted for good.
    spellings: Mapping[str, str] = field(default_factory=dict)
    # Flat keys of this project's that moved into the section: one more release, warned.
    deprecated: Mapping[str, str] = field(default_factory=dict)
    # Yes/no keys that choose a core key's value.
    switches: Mapping[str, Switch] = field(default_factory=dict)
    # Flat keys (the manual's) that mean nothing here → why: dropped with a warning.
    ignored: Mapping[str, str] = field(default_factory=dict)

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

    def flat_keys(self) -> list[tuple[str, str, bool]]:
        """(flat key, the field it sets, whether it is deprecated) for every other spelling."""
        return [(old, new, False) for old, new in self.spellings.items()] + [
            (old, new, True) for old, new in self.deprecated.items()
        ]

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


def warn_deprecated(old: str, new: str) -> None:
    log.warning("%s is deprecated and will be removed in the next release; write %s", old, new)


@dataclass(frozen=True)
class Respelled:
    """Sections with every other spelling moved into its section (raw, or validated once
    bound), and the core keys that switches chose."""

    sections: dict[str, Any]
    chosen: dict[str, str]


def respell(
    raw: Mapping[str, Any],
    declared: Iterable[Section[Any]],
    where: str = "",
    core: Mapping[str, Any] | None = None,
) -> Respelled:
    """`raw` sections (and flat keys waiting among them) with each key a declared section
    spells moved into that section. `where` prefixes keys in messages (`models.m1.`);
    `core` holds the core keys set explicitly, which a switch may not contradict.

    Setting a key both ways is an error: which one was meant is not ours to guess. Keys no
    section spells stay where they are, for binding to refuse.
    """
    moved = dict(raw)
    switched: list[tuple[str, Switch, bool]] = []
    for section in declared:
        for key, why in section.ignored.items():
            if key in moved:
                del moved[key]
                log.warning("%s%s is ignored: %s", where, key, why)
        switched += [
            (name, switch, moved[name] is not False)
            for name, switch in section.switches.items()
            if name in moved
        ]
        for name in section.switches:
            if name in moved and name not in section.other_names:
                del moved[name]
        for other in section.other_names:
            if other in moved:
                if section.name in moved:
                    raise ConfigError(
                        f"{where}{other}", f"another name of {where}{section.name}; write one"
                    )
                moved[section.name] = moved.pop(other)
        for old, new, deprecated in section.flat_keys():
            if old in moved:
                _move(moved, old, f"{section.name}.{new}", where, deprecated=deprecated)
    return Respelled(moved, _chosen(switched, where, core or {}))


def _move(moved: dict[str, Any], old: str, new: str, where: str, *, deprecated: bool) -> None:
    section, _, key = new.partition(".")
    target = moved.get(section)
    if target is not None and not isinstance(target, Mapping):
        raise ConfigError(f"{where}{section}", "expected a mapping of settings")
    target = moved[section] = dict(target or {})
    if key in target:
        kind = "deprecated alias" if deprecated else "another spelling"
        raise ConfigError(f"{where}{old}", f"{kind} of {where}{new}; set only that")
    target[key] = moved.pop(old)
    if deprecated:
        warn_deprecated(f"{where}{old}", f"{where}{new}")


def _chosen(
    switched: Iterable[tuple[str, Switch, bool]], where: str, core: Mapping[str, Any]
) -> dict[str, str]:
    """The core keys the switches given choose: one that is on wins over those that are off;
    two on for different values contradict each other, as does the core key set otherwise."""
    by_key: dict[str, list[tuple[str, Switch, bool]]] = {}
    for entry in switched:
        by_key.setdefault(entry[1].key, []).append(entry)
    chosen: dict[str, str] = {}
    for key, entries in by_key.items():
        on = {switch.on: name for name, switch, value in entries if value}
        if len(on) > 1:
            raise ConfigError(
                f"{where}{next(iter(on.values()))}",
                f"{' and '.join(on.values())} are mutually exclusive: each chooses a {key}",
            )
        off = [switch.off for _, switch, value in entries if not value and switch.off]
        value = next(iter(on), None) or next(iter(off), None)
        if value is None:
            continue
        if core.get(key) not in (None, value):
            names = " and ".join(name for name, _, _ in entries)
            raise ConfigError(f"{where}{key}", f"contradicts {where}{names} ({key}: {value})")
        chosen[key] = value
    return chosen


def bind(
    owner: Sectioned,
    declared: Iterable[Section[Any]],
    inactive: Iterable[str] = (),
    core: Mapping[str, Any] | None = None,
) -> Respelled:
    """Every declared section of this kind validated, and the core keys switches chose
    (`core`: those set explicitly); an undeclared section is an error.

    A section no active plugin declares may belong to a plugin that is
    installed but disabled (`inactive`), or to none: either way it is refused
    rather than ignored, as ignoring e.g. `auth-jwt: {enabled: true}` would
    serve an open server that looks secured. So is a flat key no section spells.
    """
    sections = {section.name: section for section in declared}
    disabled = set(inactive)
    where = owner.section_key("").removesuffix(".")
    respelled = respell(owner.sections, sections.values(), f"{where}." if where else "", core)
    raw = respelled.sections
    for name, value in raw.items():
        if name in sections:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(
                owner.section_key(name), "not a setting (no core key, nor one a plugin spells)"
            )
        why = "is disabled" if name in disabled else "is not installed"
        raise ConfigError(
            owner.section_key(name),
            f"no active plugin reads this section (a plugin named {name!r} {why})",
        )
    bound = {name: section.read(owner, raw.get(name)) for name, section in sections.items()}
    return Respelled(bound, respelled.chosen)


def gather(data: dict[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Split raw settings into known keys and plugin sections (`sections`).

    A key that is not a known one is a plugin section, or a flat key a section spells
    (`n_ubatch: 512`): binding tells which, and refuses any other.
    """
    fields = set(known)
    sections = dict(data.get("sections") or {})
    kept: dict[str, Any] = {}
    for key, value in data.items():
        if key == "sections":
            continue
        if key in fields:
            kept[key] = value
        else:
            sections[key] = dict(value) if isinstance(value, Mapping) else value
    kept["sections"] = sections
    return kept
