"""Server settings (pydantic): defaults < settings file < KRONK_* environment < flags.

The core's settings are keys of their own; each plugin's are its section
(`auth-jwt: {enabled: true}`). One rule, `flag_name` and `env_name`, names
every setting's flag and environment variable after its dotted key:
`api_host` → `--api-host`, `KRONK_API_HOST`; `auth-jwt.enabled` →
`--auth-jwt-enabled`, `KRONK_AUTH_JWT_ENABLED`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from kronk_api.logs import LogFormat
from kronk_core.contract.errors import ConfigError
from kronk_core.contract.kronk_view import PluginManager
from kronk_core.contract.media import MediaConfig, allowed_host
from kronk_core.settings import spellings
from kronk_core.settings.config import (
    Duration,
    KronkConfig,
    default_base_path,
    load_model_config_file,
    merge_settings,
    parse_duration,
)
from kronk_core.settings.sections import (
    ServerSection,
    bind,
    config_error_from,
    declared_sections,
    gather,
    respell,
    warn_deprecated,
)


class ServerSettings(BaseModel):
    """What `kronk server start` runs with; each description is its flag's help."""

    model_config = ConfigDict(extra="forbid")

    api_host: str = Field(default="127.0.0.1:8080", description="HOST:PORT of the server")
    base_path: Path = Field(
        default_factory=default_base_path, description="Base directory for Kronk data"
    )
    model: str | None = Field(
        default=None,
        description="Default model id, or a model file's path (unset: the default model a "
        "plugin's package ships)",
    )
    model_config_file: Path | None = Field(
        default=None, description="YAML file with per-model settings"
    )
    model_dirs: list[Path] | None = Field(
        default=None,
        description="More folders of model files besides <base>/models, comma-separated "
        "(served by file name)",
    )
    preload: bool = Field(
        default=False, description="Load the default model at start instead of on first use"
    )
    context_window: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="Tokens per slot for models whose entry sets none, at most their training "
        "length (unset: the training length), lowered to what fits in memory",
    )
    auto_pull: bool = Field(
        default=False,
        description="Pull a model a request names by reference (org/repo:Q4_K_M) that is not "
        "on disk",
    )
    queue_wait_seconds: Annotated[float, Field(ge=0.0)] = Field(
        default=30.0, description="How long a request waits for queue space before 429"
    )
    models_in_cache: Annotated[int, Field(ge=1)] = Field(
        default=3, description="Most models kept loaded at once"
    )
    cache_ttl: Duration = Field(
        default=20 * 60.0,
        description="How long an idle model stays loaded, e.g. 90s, 20m, 1h; 0 = until evicted",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level: debug, info, warning or error"
    )
    log_format: LogFormat = Field(
        default="auto",
        description="Log format: text, json, or auto (text on a terminal, else JSON)",
    )
    insecure_logging: bool = Field(
        default=False,
        description="Also log request bodies (prompts) and unhandled errors' messages",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Comma-separated origins browsers may call from (none: same origin only)",
    )
    max_request_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=32 << 20, description="Largest request body; larger is 413"
    )
    max_header_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=32 << 10,
        description="Largest request line and headers, in bytes; larger is 400 and the "
        "connection closed",
    )
    max_connections_per_client: Annotated[int, Field(ge=1)] = Field(
        default=256,
        description="Most connections open at once from one client address; more are answered "
        "429 and closed",
    )
    json_max_depth: Annotated[int, Field(ge=2)] = Field(
        default=64, description="Deepest JSON nesting in a request body"
    )
    json_max_string_length: Annotated[int, Field(ge=1)] = Field(
        default=24 << 20, description="Longest JSON string in a request body, in characters"
    )
    json_max_items: Annotated[int, Field(ge=1)] = Field(
        default=100_000, description="Most items in one JSON array or object of a request body"
    )
    media_max_bytes: Annotated[int, Field(ge=1)] = Field(
        default=20 << 20, description="Largest image or sound in a request, in bytes"
    )
    media_max_items: Annotated[int, Field(ge=1)] = Field(
        default=16, description="Most images and sounds in one request"
    )
    media_max_pixels: Annotated[int, Field(ge=1)] = Field(
        default=50_000_000, description="Most pixels (width x height) of one image"
    )
    media_max_audio_seconds: Annotated[float, Field(gt=0.0)] = Field(
        default=600.0, description="Longest sound in a request, in seconds, read from its header"
    )
    media_fetch_urls: bool = Field(
        default=False, description="Fetch http(s) image URLs in requests (off: data URLs only)"
    )
    media_fetch_timeout: Annotated[float, Field(gt=0.0)] = Field(
        default=10.0,
        description="Seconds fetching a request's image URLs may take, all of them together",
    )
    media_fetch_allow_hosts: list[str] = Field(
        default_factory=list,
        description="Comma-separated hosts (names, addresses, networks) image URLs may name "
        "although their addresses are not public (loopback, private, link-local)",
    )
    # The manual's HTTP timeouts (Go's http.Server's, which its names are, as is
    # read_header_timeout's), enforced by kronk_api.timeouts, kronk_api.connections and uvicorn.
    read_header_timeout: Annotated[Duration, Field(gt=0.0)] = Field(
        default=10.0,
        description="How long a client may take to send a request's headers, e.g. 10s, from "
        "when it connects or starts its next request; slower is closed",
    )
    read_timeout: Annotated[Duration, Field(gt=0.0)] = Field(
        default=30.0,
        description="How long a client may take to send a request's body, e.g. 30s; slower is "
        "408 and the connection closed",
    )
    write_timeout: Annotated[Duration, Field(gt=0.0)] = Field(
        default=15 * 60.0,
        description="How long a response may wait for a client that stopped reading it, e.g. "
        "15m; then the connection is dropped and the generation cancelled",
    )
    idle_timeout: Annotated[Duration, Field(gt=0.0)] = Field(
        default=60.0,
        description="How long an idle keep-alive connection stays open, e.g. 1m",
    )
    shutdown_timeout: Duration = Field(
        default=60.0,
        description="How long a stopping server lets running requests finish, e.g. 1m; then "
        "they are cancelled",
    )
    engine_step_deadline: Annotated[Duration, Field(gt=0.0)] = Field(
        default=60.0,
        description="How long a model's engine may take over one step (admitting requests, "
        "a decode) before readiness answers 503, e.g. 60s",
    )
    # Plugin sections by name: raw mappings until bound, then each plugin's validated model.
    sections: dict[str, Any] = Field(default_factory=dict)

    @field_validator("cors_origins", "media_fetch_allow_hosts", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("media_fetch_allow_hosts")
    @classmethod
    def _allowed_hosts(cls, hosts: list[str]) -> list[str]:
        return [allowed_host(host) for host in hosts]

    @field_validator("api_host")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return check_host_port(value)

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> Any:
        return _as_written(data) if isinstance(data, dict) else data

    def section_key(self, name: str) -> str:
        return name

    @property
    def host(self) -> str:
        return self.api_host.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.api_host.rpartition(":")[2])

    def kronk_config(self) -> KronkConfig:
        models = load_model_config_file(self.model_config_file) if self.model_config_file else {}
        values: dict[str, Any] = {
            "base_path": self.base_path.expanduser(),
            "default_model": self.model,
            "models": models,
            "queue_wait_seconds": self.queue_wait_seconds,
            "models_in_cache": self.models_in_cache,
            "cache_ttl": self.cache_ttl,
            "context_window": self.context_window,
            "auto_pull": self.auto_pull,
            "media": MediaConfig(
                max_bytes=self.media_max_bytes,
                max_items=self.media_max_items,
                max_pixels=self.media_max_pixels,
                max_audio_seconds=self.media_max_audio_seconds,
                fetch_urls=self.media_fetch_urls,
                fetch_timeout=self.media_fetch_timeout,
                fetch_allow_hosts=self.media_fetch_allow_hosts,
            ),
        }
        # Unset: KronkConfig reads KRONK_MODEL_DIRS itself, as it does for the SDK.
        if self.model_dirs is not None:
            values["model_dirs"] = self.model_dirs
        try:
            return KronkConfig.model_validate(values)
        except ValidationError as exc:
            raise config_error_from(exc) from None


def _as_written(
    values: dict[str, Any], sections: Iterable[ServerSection[Any]] = ()
) -> dict[str, Any]:
    """The manual's names of server keys made ours, plugin sections gathered, with the
    flat keys the given sections spell moved in."""
    values = dict(values)
    for old, new in spellings.SERVER_KEYS.items():
        if old in values:
            if new in values:
                raise ConfigError(old, f"another spelling of {new}; set only that")
            values[new] = values.pop(old)
    gathered = gather(values, ServerSettings.model_fields)
    gathered["sections"] = respell(gathered["sections"], sections).sections
    return gathered


def check_host_port(value: str) -> str:
    """`value` if it is HOST:PORT (a field validator's check), else ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


def split_list(value: Any) -> Any:
    """Flags and environment variables give a list as one comma-separated string."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


# ---- one rule for flags and environment variables -----------------------------------


def flag_name(key: str) -> str:
    """`auth-jwt.enabled` → `--auth-jwt-enabled`."""
    return "--" + key.replace(".", "-").replace("_", "-")


def env_name(key: str) -> str:
    """`auth-jwt.enabled` → `KRONK_AUTH_JWT_ENABLED`."""
    return "KRONK_" + key.replace(".", "_").replace("-", "_").upper()


@dataclass(frozen=True)
class Setting:
    """One server setting: its dotted key and its pydantic field."""

    key: str
    field: FieldInfo

    @property
    def flag(self) -> str:
        return flag_name(self.key)

    @property
    def env(self) -> str:
        return env_name(self.key)

    @property
    def is_bool(self) -> bool:
        return self.field.annotation is bool

    @property
    def is_list(self) -> bool:
        annotation = self.field.annotation
        return get_origin(annotation) is list or any(
            get_origin(arg) is list for arg in get_args(annotation)
        )

    @property
    def metavar(self) -> str:
        annotation = self.field.annotation
        if get_origin(annotation) is Literal:
            return "[" + "|".join(str(arg) for arg in get_args(annotation)) + "]"
        if self.is_list:
            return "A,B,..."
        if any(getattr(item, "func", None) is parse_duration for item in self.field.metadata):
            return "DURATION"
        types = {arg for arg in (annotation, *get_args(annotation)) if arg is not type(None)}
        for kind, name in ((Path, "PATH"), (int, "INTEGER"), (float, "NUMBER")):
            if kind in types:
                return name
        return "TEXT"

    def default_text(self) -> str:
        default = self.field.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(default)
        return "" if default in (None, "") else str(default)


def server_sections(manager: PluginManager) -> list[ServerSection[Any]]:
    """The server settings sections the active plugins declare."""
    declared = declared_sections(manager, ServerSection, set(ServerSettings.model_fields))
    return [section for _, section in declared.values()]


def all_settings(sections: Iterable[ServerSection[Any]]) -> list[Setting]:
    """Every server setting: the core's, then each plugin section's fields."""
    found = [
        Setting(name, field)
        for name, field in ServerSettings.model_fields.items()
        if name != "sections"
    ]
    for section in sections:
        found += [
            Setting(f"{section.name}.{name}", field)
            for name, field in section.schema.model_fields.items()
        ]
    return found


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"auth-jwt.enabled": True} → {"auth-jwt": {"enabled": True}}."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        section, _, name = key.rpartition(".")
        (nested.setdefault(section, {}) if section else nested)[name] = value
    return nested


@dataclass(frozen=True)
class OtherSpelling:
    """Another name of a server setting: a flat key (flag `--auth-enabled`, variable
    `KRONK_AUTH_ENABLED`) that a plugin section spells; the manual's, or deprecated."""

    name: str
    key: str
    deprecated: bool


def other_spellings(sections: Iterable[ServerSection[Any]]) -> list[OtherSpelling]:
    """The manual's names of server keys, then each section's flat keys."""
    core = [OtherSpelling(old, new, False) for old, new in spellings.SERVER_KEYS.items()]
    return core + [
        OtherSpelling(old, f"{section.name}.{new}", deprecated)
        for section in sections
        for old, new, deprecated in section.flat_keys()
    ]


def environment_values(
    settings: Iterable[Setting],
    environ: Mapping[str, str],
    others: Iterable[OtherSpelling] = (),
) -> dict[str, Any]:
    """Settings from KRONK_* variables, by dotted key.

    A variable of another spelling (the manual's `KRONK_WEB_API_HOST`, a section's flat
    key) counts only when the rule's is unset; a deprecated one with a warning.
    """
    known = {setting.key: setting for setting in settings}
    values = {key: environ[s.env] for key, s in known.items() if s.env in environ}
    variables = {name: (key, False) for name, key in spellings.SERVER_ENVIRONMENT.items()}
    variables.update({env_name(other.name): (other.key, other.deprecated) for other in others})
    for variable, (key, deprecated) in variables.items():
        if variable in environ and key in known and key not in values:
            if deprecated:
                warn_deprecated(variable, known[key].env)
            values[key] = environ[variable]
    return {
        key: split_list(value) if known[key].is_list else value for key, value in values.items()
    }


def environment_for(settings: ServerSettings, schema: Iterable[Setting]) -> dict[str, str]:
    """The KRONK_* variables that reproduce `settings` (a detached server's environment).

    Only the settings given (flags, variables, file): one left at its default stays a
    default in the child, which a plugin may treat apart (mcp.listen's taken default port
    is logged, a chosen one fails the start).
    """
    flat = settings.model_dump(mode="json", exclude={"sections"}, exclude_unset=True)
    for name, section in settings.sections.items():
        dumped = (
            section.model_dump(mode="json", exclude_unset=True)
            if isinstance(section, BaseModel)
            else section
        )
        flat.update({f"{name}.{key}": value for key, value in dumped.items()})
    return {
        setting.env: _environment_value(flat[setting.key])
        for setting in schema
        if flat.get(setting.key) is not None
    }


def _environment_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


# ---- loading --------------------------------------------------------------------------


def load_settings(
    file: Path | None,
    overrides: Mapping[str, Any],
    sections: Iterable[ServerSection[Any]] = (),
) -> ServerSettings:
    """File values under explicit overrides (flags and environment, as nested keys).

    The flat keys `sections` spell are moved into them first, so an override beats a file's
    `auth_enabled`; others wait for binding.
    """
    values: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError("config", f"cannot read {file}: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{file} must hold a mapping of settings")
        values = _as_written(loaded, sections)
    values = merge_settings(values, _as_written(dict(overrides), sections))
    try:
        return ServerSettings.model_validate(values)
    except ValidationError as exc:
        raise config_error_from(exc) from None


def bind_sections(settings: ServerSettings, manager: PluginManager) -> ServerSettings:
    """`settings` with every plugin section validated (ConfigError naming the key)."""
    bound = bind(settings, server_sections(manager), manager.disabled)
    return settings.model_copy(update={"sections": bound.sections})
