"""Hook implementation: the generic jinja template processor (most general, so trylast)."""

from __future__ import annotations

from pathlib import Path

from kronk_core import hookimpl
from kronk_core.backend import ModelInfo
from kronk_core.config import ModelConfig
from kronk_core.errors import ConfigError
from kronk_core.templates import TemplateProcessor
from kronk_templates.formats import FORMATS, detect_format, uses_think
from kronk_templates.jinja import BUNDLED, JinjaTemplateProcessor, bundled_source


def choose_template(model_info: ModelInfo, model_config: ModelConfig) -> tuple[str, str]:
    """(name, jinja source): config `template:` first, then GGUF metadata, then by architecture."""
    chosen = model_config.template
    if chosen:
        if chosen in BUNDLED:
            return chosen, bundled_source(chosen)
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise ConfigError(
                "template",
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


@hookimpl(trylast=True)
def kronk_template_processor(
    model_info: ModelInfo, model_config: ModelConfig
) -> TemplateProcessor | None:
    name, source = choose_template(model_info, model_config)
    format_name = model_config.tool_format or detect_format(source, model_info.architecture)
    tool_format = FORMATS.get(format_name)
    if tool_format is None:
        raise ConfigError(
            "tool_format", f"unknown tool format {format_name!r}; known: {', '.join(FORMATS)}"
        )
    return JinjaTemplateProcessor(
        name,
        source,
        model_info.bos_token,
        model_info.eos_token,
        tool_format,
        think=uses_think(source),
    )
