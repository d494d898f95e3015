"""Hooks the templates plugin defines and calls: the tool-format registry.

Added to the plugin manager by this plugin (`kronk_addhooks`). A plugin that
implements them should mark its hookimpl `optionalhook=True`, so it still
loads when the templates plugin is disabled.
"""

from __future__ import annotations

import pluggy

from kronk_core.contract import KronkView, Register, RegistryKind
from kronk_templates.formats.base import ToolFormat

hookspec = pluggy.HookspecMarker("kronk")

TOOL_FORMATS: RegistryKind[ToolFormat] = RegistryKind("tool_formats")


@hookspec
def kronk_register_tool_formats(register: Register[ToolFormat], kronk: KronkView) -> None:
    """Register tool-call formats by name: `register("hermes", HermesFormat())`.

    A model's `templates.tool_format` selects one by name; unset, the format
    is detected from the chat template's markup. A ToolFormat parses a
    family's tool-call markup out of generated text and constrains a forced
    call (`kronk_templates.formats.base.ToolFormat`).
    """
