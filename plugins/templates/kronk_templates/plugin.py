"""Hook implementations of the templates plugin: the jinja processor and the tool formats."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pluggy

from kronk_core import hookimpl
from kronk_core.contract import (
    ConfigError,
    KronkView,
    ModelConfig,
    ModelInfo,
    Register,
    Registry,
    Section,
    TemplateProcessor,
    TemplateProcessorFactory,
)
from kronk_templates import hookspecs
from kronk_templates.formats import FORMATS, ToolFormat, detect_format, uses_think
from kronk_templates.jinja import BUNDLED, JinjaTemplateProcessor, bundled_source
from kronk_templates.settings import SETTINGS

log = logging.getLogger(__name__)


def choose_template(model_info: ModelInfo, model_config: ModelConfig) -> tuple[str, str]:
    """(name, jinja source): `templates.template` first, then GGUF metadata, then architecture."""
    chosen = SETTINGS.of(model_config).template
    if chosen:
        if chosen in BUNDLED:
            return chosen, bundled_source(chosen)
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{model_config.section_key(SETTINGS.name)}.template",
                f"{chosen!r} is neither a bundled template ({', '.join(BUNDLED)}) "
                "nor a readable .jinja file",
            )
        return path.stem, path.read_text(encoding="utf-8")
    if model_info.chat_template:
        return "gguf", model_info.chat_template
    if model_info.architecture.startswith("gemma"):
        return "gemma", bundled_source("gemma")
    if model_info.architecture == "llama":
        return "llama3", bundled_source("llama3")
    return "chatml", bundled_source("chatml")


def jinja_processor(
    formats: Registry[ToolFormat], *, model_config: ModelConfig, model_info: ModelInfo
) -> TemplateProcessor:
    name, source = choose_template(model_info, model_config)
    chosen = SETTINGS.of(model_config).tool_format
    tool_format = formats.get(
        chosen or detect_format(source, model_info.architecture),
        f"{model_config.section_key(SETTINGS.name)}.tool_format",
    )

    def processor(
        name: str, source: str, fallback: JinjaTemplateProcessor | None = None
    ) -> JinjaTemplateProcessor:
        bos, eos = model_info.bos_token, model_info.eos_token
        think = uses_think(source)
        return JinjaTemplateProcessor(name, source, bos, eos, tool_format, think, fallback)

    # ChatML renders what the model's own template cannot, as llama.cpp does.
    chatml = None if name == "chatml" else processor("chatml", bundled_source("chatml"))
    try:
        return processor(name, source, chatml)
    except ConfigError as exc:
        if name != "gguf" or chatml is None:
            raise  # a template the configuration names is the user's to fix
        log.warning("%s: %s; rendering ChatML instead", model_config.id, exc)
        return chatml


@hookimpl
def kronk_addhooks(plugin_manager: pluggy.PluginManager) -> None:
    plugin_manager.add_hookspecs(hookspecs)


@hookimpl
def kronk_settings() -> Sequence[Section[Any]]:
    return [SETTINGS]


@hookimpl
def kronk_register_tool_formats(register: Register[ToolFormat]) -> None:
    for name, tool_format in FORMATS.items():
        register(name, tool_format)


@hookimpl
def kronk_register_template_processors(
    register: Register[TemplateProcessorFactory], kronk: KronkView
) -> None:
    def jinja(*, model_config: ModelConfig, model_info: ModelInfo) -> TemplateProcessor:
        return jinja_processor(
            kronk.registry(hookspecs.TOOL_FORMATS), model_config=model_config, model_info=model_info
        )

    register("jinja", jinja, default=True)
