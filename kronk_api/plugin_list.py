"""What `kronk plugins` shows: each installed plugin, what it provides, whether it is active."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kronk_core import Kronk
from kronk_core.settings.sections import ModelSection, ServerSection, declared_sections

REGISTER_HOOK = "kronk_register_"


@dataclass
class PluginReport:
    name: str
    distribution: str | None
    active: bool
    hooks: list[str] = field(default_factory=list)
    # Registry kind (cache_strategies, tool_formats, ...) → the names this plugin registered.
    registered: dict[str, list[str]] = field(default_factory=dict)
    # "server" / "model" → the settings sections this plugin declared.
    settings: dict[str, list[str]] = field(default_factory=dict)


def describe_plugins(kronk: Kronk) -> list[PluginReport]:
    """The active plugins of `kronk` with what they provide, then the disabled ones."""
    manager = kronk.plugins
    kinds = sorted(
        name.removeprefix(REGISTER_HOOK)
        for name in vars(manager.hook)
        if name.startswith(REGISTER_HOOK)
    )
    registries = {kind: kronk.registry(kind) for kind in kinds}
    sections: dict[str, dict[str, tuple[str, Any]]] = {
        "server": declared_sections(manager, ServerSection, set()),
        "model": declared_sections(manager, ModelSection, set()),
    }
    reports: list[PluginReport] = []
    for name, plugin in sorted(manager.list_name_plugin()):
        report = PluginReport(name, manager.distributions.get(name), active=True)
        report.hooks = sorted(caller.name for caller in manager.get_hookcallers(plugin) or ())
        for kind, registry in registries.items():
            owned = [item for item in registry.names() if registry.owners[item] == name]
            if owned:
                report.registered[kind] = owned
        for level, declared in sections.items():
            owned = sorted(section for section, (owner, _) in declared.items() if owner == name)
            if owned:
                report.settings[level] = owned
        reports.append(report)
    reports += [PluginReport(name, None, active=False) for name in sorted(manager.disabled)]
    return reports
