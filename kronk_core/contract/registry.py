"""Named registries: what configuration selects by name (`cache: imc`).

Each registry is filled by one hook, `kronk_register_<kind>(register, kronk)`,
whose implementations call `register(name, item)`; a third party adds a cache
strategy, a template processor, a tool format or a limit store by registering
a name. `register(name, item, default=True)` also makes it what an unset key
selects, so the core never names a plugin's item. Plugins may own registries of
their own (see `kronk_addhooks`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pluggy

from kronk_core.contract.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


@dataclass(frozen=True)
class RegistryKind(Generic[T]):
    """A registry's name, typed by its items: `kronk.registry(CACHE_STRATEGIES)` is a
    `Registry[CacheStrategyFactory]`. Filled by the hook `kronk_register_<name>`."""

    name: str


class Register(Protocol[T_contra]):
    """What a `kronk_register_*` hook is given: `register(name, item, default=False)`."""

    def __call__(self, name: str, item: T_contra, *, default: bool = False) -> None: ...


class Registry(Generic[T]):
    """Items by name, each with the plugin that registered it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self.owners: dict[str, str] = {}
        # What an unset key selects: the first item registered with default=True.
        self.default: str | None = None

    def add(self, name: str, item: T, plugin: str, default: bool = False) -> None:
        """The first registration of a name wins (pluggy calls the last registered plugin
        first, so a plugin registered after a built-in replaces its name), and so does the
        first default."""
        if default and self.default is None:
            self.default = name
        if name in self._items:
            log.info(
                "%s %r of plugin %s is shadowed by plugin %s's",
                self.kind,
                name,
                plugin,
                self.owners[name],
            )
            return
        self._items[name] = item
        self.owners[name] = plugin

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """Every item by name, in the order their plugins were called (that of `add`)."""
        return list(self._items.items())

    def get(self, name: str | None, key: str) -> T:
        """The item called `name` (None: the default); a ConfigError naming `key` (what
        selected it) if none is."""
        known = ", ".join(self.names()) or "none"
        if name is None:
            name = self.default
            if name is None:
                why = f"not set, and no active plugin registers a default {self.kind}"
                raise ConfigError(key, f"{why} (registered: {known})")
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(
                key, f"no active plugin registers {name!r} in {self.kind} (registered: {known})"
            ) from None


def each_plugin(
    caller: pluggy.HookCaller, arguments: Callable[[str], Mapping[str, Any]] = lambda _: {}
) -> Iterator[tuple[str, Any]]:
    """Call each implementation of a hook on its own, in pluggy's order: (plugin, answer).

    For hooks whose answers must be told apart by plugin (registries, settings);
    `arguments(plugin)` gives the hook's arguments for that plugin.
    """
    for impl in reversed(caller.get_hookimpls()):
        given = arguments(impl.plugin_name)
        yield impl.plugin_name, impl.function(**{name: given[name] for name in impl.argnames})


def fill_registry(manager: pluggy.PluginManager, kind: str, **arguments: Any) -> Registry[Any]:
    """Fill a registry by calling `kronk_register_<kind>` on every plugin."""
    caller = getattr(manager.hook, f"kronk_register_{kind}", None)
    if caller is None:
        raise ConfigError(kind, "no active plugin defines this registry")
    registry: Registry[Any] = Registry(kind)

    def for_plugin(plugin: str) -> dict[str, Any]:
        def register(name: str, item: Any, *, default: bool = False) -> None:
            registry.add(name, item, plugin, default)

        return {"register": register, **arguments}

    for _ in each_plugin(caller, for_plugin):
        pass
    return registry
