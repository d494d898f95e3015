"""The templates plugin's section of each model's entry (`models.<id>.templates`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kronk_core.contract import ModelSection


class TemplateSettings(BaseModel):
    """Which chat template the jinja processor renders, and which tool-call format it reads."""

    model_config = ConfigDict(extra="forbid")

    # A bundled template's name or the path of a jinja file; None: the GGUF's own, else
    # one chosen by architecture.
    template: str | None = None
    # A name registered by kronk_register_tool_formats (hermes, qwen3_coder, llama3, harmony,
    # mistral, mistral_nemo, gemma, ...); None: detected from the chat template.
    tool_format: str | None = None


SETTINGS = ModelSection(
    "templates",
    TemplateSettings,
    deprecated={"template": "template", "tool_format": "tool_format"},
)
