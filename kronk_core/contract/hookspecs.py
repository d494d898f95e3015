"""The plugin contract: every hook a Kronk plugin can implement.

Plugins are pluggy plugins of project "kronk", found through the entry-point
group "kronk". Implement a hook by defining a function with the same name,
decorated with `kronk_core.hookimpl`. Built-in features use exactly these hooks.
The same name means the same thing in every hook: `kronk` the Kronk view
(kronk_core.contract.kronk_view: the hook caller, typed registries, the configuration,
observer subscriptions, a read-only view of the pool), `model_config` a model's settings,
`model_info` what the backend found in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from kronk_core.contract.backend import Backend, ModelInfo
from kronk_core.contract.cache import CacheStrategyFactory
from kronk_core.contract.drafts import DraftStrategyFactory
from kronk_core.contract.kronk_view import KronkView
from kronk_core.contract.records import ChatRecord, RequestRecord
from kronk_core.contract.registry import Register
from kronk_core.contract.sampling import SamplerStage
from kronk_core.contract.server_tools import ServerTool
from kronk_core.contract.templates import TemplateProcessorFactory
from kronk_core.contract.types import SamplingParams

if TYPE_CHECKING:
    import click
    from litestar.config.app import AppConfig

    from kronk_core.settings.config import ModelConfig
    from kronk_core.settings.sections import Section, Sectioned


hookspec = pluggy.HookspecMarker("kronk")


@hookspec
def kronk_addhooks(plugin_manager: pluggy.PluginManager) -> None:
    """Add the hook specs your plugin defines and calls itself.

    A hook that only one plugin defines and calls belongs to that plugin:
    call `plugin_manager.add_hookspecs(your_hookspecs_module)` here (as
    pytest's `pytest_addhooks`). Called once, after every plugin is
    registered and before implementations are checked against specs.
    """


@hookspec
def kronk_settings() -> Sequence[Section[Any]]:
    """Declare your settings sections: `ServerSection` and/or `ModelSection` instances.

    Each names its key (by convention your plugin's name) and the pydantic
    model that validates it. The core validates the section wherever it is
    written (the server settings file, flags and KRONK_* variables derived
    from the names, each model's entry) with errors that name the key, and
    refuses a section no active plugin declares. Read your settings with
    `section.of(settings)` or `section.of(model_config)`.
    """


@hookspec
def kronk_models(kronk: KronkView) -> Mapping[str, Mapping[str, Any]]:
    """Models your plugin can serve, by id, with their settings.

    Each value is a model entry as written in the model-config file (core
    keys, plugin sections, the Kronk manual's spellings), with `model_path`.
    The model-config file's entry for the same id, or for a `ID/VARIANT` of
    it, overrides these settings key by key. Called whenever the models are
    listed or one is loaded: answer from what is on disk now, quickly. The
    catalog plugin answers with the catalog models that are pulled.
    """


@hookspec
def kronk_pull_hint() -> str | None:
    """Tell a user how your plugin gets a model that is not here, in one sentence (your pull
    command), or return None. Every answer ends the 404 of a request for an unknown model.
    """


@hookspec(firstresult=True)
def kronk_resolve_model(kronk: KronkView, reference: str, pull: bool) -> str | None:
    """Name the model a reference stands for: the id of a model on disk, or None to pass.

    Called for a name no model answers to (no model-config entry, alias, plugin's
    model or file), such as `org/repo:Q4_K_M`, and for a model-config entry's
    `source`. With `pull` the user asked for that model (`kronk run REF`, the
    server's `--model REF`, an entry's `source`, a request to a server with
    `auto_pull` on): fetch it when it is not on disk. Runs in a worker thread; a
    pull may take minutes. The catalog plugin answers for Hugging Face references.
    """


@hookspec
def kronk_register_backends(register: Register[Backend], kronk: KronkView) -> None:
    """Register backends by name: `register("toy", ToyBackend())` (kronk_core.contract.backend).

    A model's `backend:` key selects one by name; unset, the first backend whose
    `model_file` recognises the model's file, else the default (the llamacpp plugin
    registers "llamacpp" with `default=True`). Every registered backend is asked for its
    model files, the models PyPI packages ship for it and its devices; a model's own
    backend for its facts, its memory estimate and its load.
    """


@hookspec
def kronk_register_cache_strategies(
    register: Register[CacheStrategyFactory], kronk: KronkView
) -> None:
    """Register cache strategies by name: `register("imc", factory)`.

    A model's `cache:` key selects one by name (default "imc"; the caching
    plugin also registers "spc" and "none"). At each load the factory is
    called as `factory(model_config=..., model_info=...)` and returns the
    CacheStrategy for that model; it lives as long as the model's engine.
    `model_info.kv_trimmable` says whether the KV can be cut at any position.
    """


@hookspec
def kronk_register_draft_strategies(
    register: Register[DraftStrategyFactory], kronk: KronkView
) -> None:
    """Register draft strategies for speculative decoding by name: `register("lookup", factory)`.

    A model's `draft_strategy:` key selects one by name, or "none" (unset:
    "lookup" where one is registered and the model can drop rejected tokens;
    the speculative plugin registers "draft" and "lookup"). At
    each load the factory is called as `factory(model_config=...,
    model_info=..., model=...)` with the loaded target model and returns the
    DraftStrategy, which the model's engine owns and closes.
    """


@hookspec
def kronk_register_template_processors(
    register: Register[TemplateProcessorFactory], kronk: KronkView
) -> None:
    """Register template processors by name: `register("jinja", factory)`.

    A model's `template_processor:` key selects one by name. At each load the
    factory is called as `factory(model_config=..., model_info=...)` and
    returns the model's TemplateProcessor.
    """


@hookspec(firstresult=True)
def kronk_sampler_stages(
    params: SamplingParams, model_info: ModelInfo
) -> list[SamplerStage] | None:
    """Return the ordered sampler stages for one request, or None to pass.

    `params` are fully resolved (request > model config > defaults). The list
    must end with a token-selecting stage (Greedy, Distribution or
    AdaptiveP). The backend builds its native chain from it. The built-in
    implementation is `trylast`, so any plugin answering first replaces it.
    """


@hookspec
def kronk_app(app_config: AppConfig, kronk: KronkView) -> None:
    """Add what your plugin serves to the server's Litestar `AppConfig` before it is built.

    Append to `route_handlers` (handlers or Routers; name each handler's endpoint in its
    `opt`, `opt={"kronk_endpoint": "chat-completions"}`, see `kronk_api.endpoints`, so
    that authentication knows what it guards: with auth on, a route without that key is
    for admin tokens only), `guards` (applied to every route; a guard reads
    `handler.opt["kronk_endpoint"]`, and a `KronkError` it raises is answered in the
    route's own dialect), `middleware`, `exception_handlers` (app-wide fallbacks: dialects
    map their errors in their own routers) and `lifespan`: an async context manager
    factory `(app) -> AsyncContextManager` that starts what your plugin runs and stops
    it. Lifespans start in list order once the server's own has (models preloaded) and
    stop in reverse, before the models unload: a `trylast` hookimpl's start last and stop
    first. `app.state.settings` holds the `ServerSettings` (your section:
    `section.of(app.state.settings)`); keep per-server state on `app.state`. The SDK alone
    never calls this hook: a program embedding `Kronk` owns its lifecycle.
    """


@hookspec
def kronk_server_tools(settings: Sectioned, kronk: KronkView) -> Sequence[ServerTool]:
    """Offer tools the server runs itself (kronk_core.contract.server_tools.ServerTool).

    Called once per server, with its settings (your section: `section.of(settings)`), the
    first time a request could use one: return the tools your configuration enables, or
    none. The dialects serve their clients' built-in tools with them (the server tool named
    `WEB_SEARCH` serves OpenAI's and Anthropic's built-in web search); an SDK program passes
    tools to `kronk_core.tool_loop.start_tool_loop` itself. When the model calls one, Kronk
    runs it and continues the answer with its result, inside the request. The first tool
    of a name wins. The mcp plugin offers `web_search` when it has a Brave Search API key.
    """


@hookspec
def kronk_request_finished(record: RequestRecord) -> None:
    """Called after every generation ends: finished, cancelled or failed (observability).

    Runs on the model's engine thread between decode steps, so it must be quick;
    exceptions are logged and swallowed. `record` holds counts and timings
    (queue, cache, prefill, first token, decode), never prompt or completion
    text. `current_request_id` (kronk_core.contract.records) holds its request id.
    """


@hookspec
def kronk_chat_finished(record: ChatRecord) -> None:
    """Called when a chat stream ends: finished, failed, or left by its client.

    Runs on the event loop, in the context of the task that iterated the
    stream (so contextvars set around the request, such as a tracing span,
    are visible); exceptions are logged and swallowed. `record` has the SDK's
    timings (model lease, prompt creation, output parsing), the final usage
    (reasoning tokens included) and the engine's `RequestRecord` as
    `record.generation`; never prompt or completion text.
    """


@hookspec
def kronk_model_loaded(model_config: ModelConfig, model_info: ModelInfo, seconds: float) -> None:
    """Called after a model loaded, with how long the load took.

    Runs on the thread that loaded it, in the context of the request that
    caused the load (none for a preload); exceptions are logged and swallowed.
    """


@hookspec
def kronk_cli(group: click.Group) -> None:
    """Add sub-commands to the `kronk` command-line group."""
