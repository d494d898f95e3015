"""The plugin contract: every hook a Kronk plugin can implement.

Plugins are pluggy plugins of project "kronk", found through the entry-point
group "kronk". Implement a hook by defining a function with the same name,
decorated with `kronk_core.hookimpl`. Built-in features use exactly these hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from kronk_core.backend import Backend, ModelInfo
from kronk_core.config import ModelConfig
from kronk_core.events import RequestRecord
from kronk_core.limits import LimitStore
from kronk_core.memory import Device, MemoryEstimate
from kronk_core.sampling import SamplerStage
from kronk_core.slots import CacheStrategy
from kronk_core.templates import TemplateProcessor
from kronk_core.types import SamplingParams

if TYPE_CHECKING:
    import click
    from litestar import Litestar

    from kronk_core.sdk import Kronk

hookspec = pluggy.HookspecMarker("kronk")


@hookspec(firstresult=True)
def kronk_backend(model_config: ModelConfig) -> Backend | None:
    """Claim a model: return a Backend that can load it, or None to pass.

    Called once per model load with the validated model config (its
    `model_path` is resolved). The first non-None answer wins; use
    `tryfirst=True` on your hookimpl to claim files another backend would also
    claim. The built-in llamacpp backend claims `.gguf` files.
    """


@hookspec
def kronk_devices() -> Sequence[Device]:
    """Return the devices your backend can place models on, with their free and total memory.

    Called by `kronk devices` and `GET /v1/kronk/devices`; every backend's answer is listed.
    The built-in llamacpp backend lists llama.cpp's backend devices (CPU, CUDA0, ...).
    """


@hookspec(firstresult=True)
def kronk_memory_estimate(model_config: ModelConfig) -> MemoryEstimate | None:
    """Estimate what loading this model would take, and where, or return None to pass.

    `model_config.model_path` is resolved. Called by `kronk model show` and the model-pool
    endpoint; it must not load the model. The built-in llamacpp backend answers for `.gguf`
    files from the GGUF header (weights + KV cache per slot x slots, by cache type).
    """


@hookspec(firstresult=True)
def kronk_cache_strategy(
    name: str, model_config: ModelConfig, model_info: ModelInfo
) -> CacheStrategy | None:
    """Return the CacheStrategy called `name` for this model, or None if you do not provide it.

    `name` is what the model config selects: "none", "spc"
    (system_prompt_cache) or "imc" (incremental_cache). `model_info` says
    whether the KV can be trimmed at any position (`kv_trimmable`). The
    strategy object lives as long as the model's engine and is only called
    from the engine thread.
    """


@hookspec(firstresult=True)
def kronk_sampler_stages(params: SamplingParams, model: ModelInfo) -> list[SamplerStage] | None:
    """Return the ordered sampler stages for one request, or None to pass.

    `params` are fully resolved (request > model config > defaults). The list
    must end with a token-selecting stage (Greedy, Distribution or
    AdaptiveP). The backend builds its native chain from it. The built-in
    implementation is `trylast`, so any plugin answering first replaces it.
    """


@hookspec(firstresult=True)
def kronk_template_processor(
    model_info: ModelInfo, model_config: ModelConfig
) -> TemplateProcessor | None:
    """Return the TemplateProcessor for this model, or None to pass.

    Most specific wins: a processor for one model family should answer only
    when `model_info.architecture`, `model_info.chat_template` or
    `model_config.template` says it is that family. The generic jinja
    processor is `trylast`.
    """


@hookspec
def kronk_routes(kronk: Kronk) -> Sequence[Any]:
    """Return Litestar route handlers (or Routers) to mount on the server.

    `kronk` is the SDK facade the server runs on: use it to reach models and
    configuration. Paths must not collide with another plugin's. Name each
    handler's endpoint in its `opt` (`opt={"kronk_endpoint": "chat-completions"}`,
    see `kronk_api.endpoints`) so that authentication knows what it guards; with
    auth on, a route without that key is for admin tokens only.
    """


@hookspec
def kronk_guards(kronk: Kronk) -> Sequence[Callable[..., Any]]:
    """Return Litestar guards applied to every route (e.g. authentication).

    A guard reads `handler.opt["kronk_endpoint"]` to learn which endpoint it
    guards. A `KronkError` it raises is answered by the route's own dialect
    (its router-level exception handler), so it comes out in that dialect's shape.
    """


@hookspec
def kronk_middleware(kronk: Kronk) -> Sequence[Any]:
    """Return Litestar middleware (classes or DefineMiddleware) for the whole app."""


@hookspec
def kronk_exception_handlers(kronk: Kronk) -> Mapping[type[Exception], Callable[..., Any]]:
    """Return {exception type: Litestar exception handler} for the whole app.

    Dialects map errors to their own shape in their own route handlers; this
    hook is for app-wide fallbacks.
    """


@hookspec
def kronk_startup(kronk: Kronk, app: Litestar) -> None:
    """Called once when the server has started (after an eager model load, if any).

    `app` is the server: `app.state.settings` holds its `ServerSettings`, and a
    plugin keeps its per-server state on `app.state` (guards reach it as
    `connection.app.state`). The SDK alone does not call it: a program
    embedding `Kronk` owns its lifecycle.
    """


@hookspec
def kronk_shutdown(kronk: Kronk, app: Litestar) -> None:
    """Called once when the server shuts down, before its models are unloaded."""


@hookspec(firstresult=True)
def kronk_limit_store(url: str, base_path: Path) -> LimitStore | None:
    """Open the rate-limit counter store that `url` names, or return None if it is not yours.

    `url` is the server's `auth_limit_store` setting: `"sqlite"` (a database in
    `base_path`), `"sqlite:///ABSOLUTE/PATH"`, `"redis://HOST:PORT/DB"`, or any
    scheme a plugin answers for. Called once at server start when auth is on;
    the store is closed at shutdown. The first non-None answer wins. The
    built-in SQLite and Redis stores come from the `auth-jwt` plugin.
    """


@hookspec
def kronk_request_finished(record: RequestRecord) -> None:
    """Called after every generation ends: finished, cancelled or failed (observability).

    Runs on the model's engine thread between decode steps, so it must be quick;
    exceptions are logged and swallowed. `record` holds counts and timings, never
    prompt or completion text.
    """


@hookspec
def kronk_cli(group: click.Group) -> None:
    """Add sub-commands to the `kronk` command-line group."""
