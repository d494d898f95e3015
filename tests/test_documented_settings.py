"""The manual's settings tables agree with the settings: each row's default is the real
default, its flag and variable are the ones the rule gives, and every server setting and
every plugin section's setting has a row in docs/configuration.md (one place states it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kronk_api.settings import ServerSettings, env_name, flag_name, server_sections
from kronk_core.contract.plugins import create_plugin_manager

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
