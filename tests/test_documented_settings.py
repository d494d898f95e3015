"""The manual's settings tables agree with the settings: each row's default is the real
default, its flag and variable are the ones the rule gives, and every server setting and
every plugin section's setting has a row in docs/configuration.md (one place states it).
So do its model keys: the core's, each built-in model section's and the sampling keys, each
with one row whose default is the real one, and no row for a key that does not exist."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kronk_api.settings import ServerSettings, env_name, flag_name, server_sections
from kronk_core.contract.plugins import create_plugin_manager
from kronk_core.contract.types import DEFAULT_MAX_TOKENS, SamplingParams
from kronk_core.settings.config import ModelConfig, SamplingConfig
from kronk_core.settings.sections import ModelSection, declared_sections

DOCS = Path(__file__).resolve().parent.parent / "docs"
# Defaults the tables say in words, where the field's default is not the value itself.
IN_WORDS = {
    "base_path": "`~/.kronk`",  # the default factory reads KRONK_BASE_PATH, else this
    "model": "`SmolLM2-135M-Instruct-Q4_1`",  # unset: the default model a package ships
    # Unset: read where they are used, from Hugging Face's own variables and login.
    "catalog.hf_endpoint": "`HF_ENDPOINT`",
    "catalog.hf_token": "`HF_TOKEN`",
}
# A third party's section is in its own manual, not in Kronk's.
THIRD_PARTY = frozenset({"example"})


def rows() -> Iterator[tuple[str, dict[str, str]]]:
    """(where, row by column) of every settings table in the manual: a header with
    Setting, Flag and Default columns."""
    for page in sorted(DOCS.glob("*.md")):
        header: list[str] | None = None
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if not line.startswith("|"):
                header = None
                continue
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if header is None:
                header = cells if {"Setting", "Flag", "Default"} <= set(cells) else []
                continue
            if header and not set(line) <= set("|-: "):
                yield f"{page.name}:{number}", dict(zip(header, cells, strict=False))


def documented() -> dict[str, tuple[str, dict[str, str]]]:
    found: dict[str, tuple[str, dict[str, str]]] = {}
    for where, row in rows():
        key = re.fullmatch(r"`([a-z_.-]+)`", row["Setting"])
        if key:
            found.setdefault(key[1], (where, row))
    return found


def real_settings() -> dict[str, Any]:
    """Every server setting's default by its dotted key: the server's, each section's."""
    defaults: dict[str, Any] = {
        name: field.get_default(call_default_factory=True)
        for name, field in ServerSettings.model_fields.items()
        if name != "sections"
    }
    for section in server_sections(create_plugin_manager()):
        if section.name in THIRD_PARTY:
            continue
        for name, field in section.schema.model_fields.items():
            defaults[f"{section.name}.{name}"] = field.get_default(call_default_factory=True)
    return defaults


def shown(value: Any) -> set[str]:
    """How a table may write a default."""
    if value is None or value == []:
        return {"unset", "none", "`none`"}
    if value == "":
        return {"empty"}
    if isinstance(value, bool):
        return {f"`{str(value).lower()}`"}
    if hasattr(value, "get_secret_value"):
        return {"unset"}
    if hasattr(value, "value"):  # an enum
        value = value.value
    texts = {f"`{value}`"}
    if isinstance(value, float) and value.is_integer():
        texts.add(f"`{int(value)}`")
        texts |= {f"`{text}`" for text in _durations(int(value))}
    if isinstance(value, list):
        texts.add(f"`{','.join(str(item) for item in value)}`")
    return texts


def _durations(seconds: int) -> list[str]:
    minutes, rest = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    found = [f"{seconds}s"]
    if not rest:
        whole = f"{hours}h" if hours else ""
        found.append(whole + (f"{minutes}m" if minutes or not hours else ""))
    return found


SETTINGS = real_settings()


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_each_server_setting_has_one_row_that_tells_the_truth(key: str) -> None:
    table = documented()
    assert key in table, f"{key}: no row in the manual's settings tables"
    where, row = table[key]
    default = row["Default"]
    expected = {IN_WORDS[key]} if key in IN_WORDS else shown(SETTINGS[key])
    # The first word of the cell is the value; the rest may explain it.
    first = re.split(r" \(|, |: ", default)[0].strip()
    assert first in expected or default in expected, (where, default, expected)
    flag = flag_name(key)
    assert flag in row["Flag"], (where, row["Flag"], flag)
    variable = row.get("Environment variable") or row.get("Variable") or ""
    assert env_name(key) in variable, (where, variable, env_name(key))


CONFIGURATION = DOCS / "configuration.md"
# configuration.md's tables of model keys (Key and Default columns), by the heading each is
# under: the prefix of the dotted keys its rows name.
MODEL_TABLES = {
    "Model file and backend": "",
    "Context and batching": "",
    "Cache strategy, template processor and overflow": "",
    "Embedding models": "",
    "The `llamacpp` section": "llamacpp.",
    "KV cache and attention": "llamacpp.",
    "GPU": "llamacpp.",
    "RoPE and YaRN": "llamacpp.",
    "Structured output limits": "llamacpp.structured_output.",
    "The `caching` section": "caching.",
    "The `speculative` section": "speculative.",
    "The `templates` section": "templates.",
    "Sampling": "sampling.",
}
# The chapters those tables are in: a table of keys there under another heading fails.
MODEL_CHAPTERS = ("Model keys", "Sampling")
# Model keys whose default the tables say in words: unset in the settings, decided later.
MODEL_IN_WORDS = {
    "context_window": "training length, fitted",  # fitted to memory at load
    "cache": "`imc`",  # unset: the strategy a plugin registered as the default
    "template_processor": "`jinja`",  # likewise
    "caching.host_cache_bytes": "a quarter of available memory, at most 8 GiB",
    "llamacpp.rope_freq_scale": "derived",  # from the extension ratio, with rope_scaling
    "llamacpp.yarn_orig_ctx": "training length",
    "speculative.ndraft": "5 (`draft`), 10 (`lookup`)",  # by the strategy
    "speculative.model_id": "–",  # required with `draft`
    "speculative.n_gpu_layers": "the draft's own",
    "speculative.device": "the draft's own",
    "sampling.seed": "random",
    "sampling.max_tokens": "see below",  # DEFAULT_MAX_TOKENS, checked apart
}


def _field_defaults(schema: type[BaseModel], prefix: str) -> dict[str, Any]:
    """Each field's default by its dotted key; a nested settings model's fields under its own."""
    found: dict[str, Any] = {}
    for name, field in schema.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            found |= _field_defaults(type(default), f"{prefix}{name}.")
        else:
            found[f"{prefix}{name}"] = default
    return found


def real_model_keys() -> dict[str, Any]:
    """Every model key's default: the core's (the id is the entry's name, not a key), each
    built-in model section's, and the sampling keys' (the built-in defaults they fall to)."""
    core = _field_defaults(ModelConfig, "")
    defaults = {
        key: value
        for key, value in core.items()
        if key != "id" and key != "sections" and not key.startswith("sampling.")
    }
    sections = declared_sections(create_plugin_manager(), ModelSection, set())
    for name, (_, section) in sections.items():
        if name not in THIRD_PARTY:
            defaults |= _field_defaults(section.schema, f"{name}.")
    built_in = SamplingParams()
    for name in SamplingConfig.model_fields:
        defaults[f"sampling.{name}"] = (
            DEFAULT_MAX_TOKENS if name == "max_tokens" else getattr(built_in, name)
        )
    return defaults


def model_rows() -> Iterator[tuple[str, str, str]]:
    """(where, dotted key, its Default cell) for every key a model-key table names: a row
    may name several (`ngram_min`, `ngram_max`: 2, 4); a spelling in parentheses is not one."""
    chapter = heading = ""
    header: list[str] | None = None
    fenced = False
    for number, line in enumerate(CONFIGURATION.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            chapter = heading if line.startswith("## ") else chapter
        if not line.startswith("|") or chapter not in MODEL_CHAPTERS:
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        where = f"configuration.md:{number}"
        if header is None:
            header = cells if {"Key", "Default"} <= set(cells) else []
            assert not header or heading in MODEL_TABLES, f"{where}: keys under {heading!r}"
            continue
        if not header or set(line) <= set("|-: "):
            continue
        row = dict(zip(header, cells, strict=False))
        keys = re.findall(r"`([a-z_]+)`", re.sub(r"\(.*?\)", "", row["Key"]))
        assert keys, (where, row["Key"])
        defaults = row["Default"].split(", ") if len(keys) > 1 else [row["Default"]]
        assert len(defaults) == len(keys), (where, row["Default"])
        for key, default in zip(keys, defaults, strict=True):
            yield where, MODEL_TABLES[heading] + key, default


MODEL_KEYS = real_model_keys()


def documented_model_keys() -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for where, key, default in model_rows():
        assert key not in found, f"{key}: rows at {found[key][0]} and {where}"
        found[key] = (where, default)
    return found


@pytest.mark.parametrize("key", sorted(MODEL_KEYS))
def test_each_model_key_has_one_row_that_tells_the_truth(key: str) -> None:
    table = documented_model_keys()
    assert key in table, f"{key}: no row in configuration.md's model keys"
    where, default = table[key]
    if key in MODEL_IN_WORDS:
        assert default == MODEL_IN_WORDS[key], (where, default)
        return
    # The tables write values with or without backticks; the first word is the value.
    first = re.split(r" \(|, |: ", default)[0].strip().strip("`")
    expected = {text.strip("`") for text in shown(MODEL_KEYS[key])}
    assert first in expected, (where, default, expected)


def test_the_model_key_tables_name_no_key_that_does_not_exist() -> None:
    assert set(documented_model_keys()) <= set(MODEL_KEYS)
    # `sampling.max_tokens` is "see below": the paragraph below says the default.
    assert f"`sampling.max_tokens` (default {DEFAULT_MAX_TOKENS})" in CONFIGURATION.read_text()
