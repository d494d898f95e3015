"""The plugin manager: finds plugins through entry points and registers the active ones."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType

import pluggy

from kronk_core.contract import hookspecs
from kronk_core.contract.kronk_view import PluginManager
from kronk_core.contract.selection import PluginSelection

log = logging.getLogger(__name__)


ENTRY_POINT_GROUP = "kronk"
# Callables run before any plugin module is imported: for plugins whose native libraries
# must be loaded before other extensions (see docs/plugins.md, "Native libraries first").
PRELOAD_GROUP = "kronk_preload"
hookimpl = pluggy.HookimplMarker("kronk")


def _names_from_env(variable: str) -> list[str]:
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def effective_selection(selection: PluginSelection) -> PluginSelection:
    """Config selection overridden by KRONK_PLUGINS / KRONK_DISABLE_PLUGINS when set."""
    enabled = _names_from_env("KRONK_PLUGINS") or selection.enabled
    disabled = _names_from_env("KRONK_DISABLE_PLUGINS") or selection.disabled
    return PluginSelection(enabled=enabled, disabled=disabled)


def create_plugin_manager(
    selection: PluginSelection | None = None,
    extra: dict[str, ModuleType | object] | None = None,
) -> PluginManager:
    """Register every installed `kronk` entry point the selection allows, then `extra`.

    `extra` registers in-process plugins (name → module or object) exactly as
    an installed one would be; the selection applies to them too. Then each
    plugin may add its own hook specs (`kronk_addhooks`) before every
    implementation is checked against a spec.
    """
    chosen = effective_selection(selection or PluginSelection())
    manager = PluginManager()
    manager.add_hookspecs(hookspecs)

    def allowed(name: str) -> bool:
        if name in chosen.disabled:
            return False
        return not chosen.enabled or name in chosen.enabled

    _run_preloads(allowed)
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        if not allowed(entry_point.name):
            log.info("plugin %s installed but disabled by configuration", entry_point.name)
            manager.disabled.append(entry_point.name)
            continue
        if manager.has_plugin(entry_point.name):
            continue
        plugin = entry_point.load()
        manager.register(plugin, name=entry_point.name)
        if entry_point.dist is not None:
            manager.distributions[entry_point.name] = (
                f"{entry_point.dist.name} {entry_point.dist.version}"
            )
        log.debug("registered plugin %s from %s", entry_point.name, entry_point.value)
    for name, plugin in (extra or {}).items():
        if allowed(name):
            manager.register(plugin, name=name)
            log.debug("registered plugin %s (in-process)", name)
        else:
            manager.disabled.append(name)
    manager.hook.kronk_addhooks(plugin_manager=manager)
    manager.check_pending()
    return manager


def _run_preloads(allowed: Callable[[str], bool]) -> None:
    """Run each allowed plugin's preload; a failure is logged, and raised again where it matters.

    A preload that fails (say, a missing native library) must not stop the plugin from
    registering: its commands may be what installs the library.
    """
    for entry_point in sorted(entry_points(group=PRELOAD_GROUP), key=lambda ep: ep.name):
        if not allowed(entry_point.name):
            continue
        try:
            entry_point.load()()
        except Exception as exc:
            log.warning("preload of plugin %s failed: %s", entry_point.name, exc)


def registered_plugins(manager: pluggy.PluginManager) -> list[str]:
    return [name for name, _ in manager.list_name_plugin()]
