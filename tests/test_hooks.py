"""Every hook, exercised by an in-process third-party plugin: the server-side hooks together
(test_server_hooks), then one example per hook (test_hook_<name>)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click
import httpx
import pluggy
import pytest
from click.testing import CliRunner
from litestar import Litestar, Request, Response, get
from litestar.config.app import AppConfig
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.testing import TestClient
from litestar.types import ASGIApp, Receive, Scope, Send
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel

from kronk_api import ServerSettings, create_app
from kronk_api.cli.group import KronkGroup
from kronk_auth_jwt.limits import LimitStore, LimitStoreFactory
from kronk_auth_jwt.plugin import sqlite_store
from kronk_caching.plugin import no_cache
from kronk_core import Kronk, KronkConfig, ModelConfig, hookimpl
from kronk_core.contract.backend import (
    BACKENDS,
    Backend,
    ModelFacts,
    ModelFile,
    ModelInfo,
    PackagedModel,
)
from kronk_core.contract.cache import CacheStrategy, CacheStrategyFactory
from kronk_core.contract.drafts import DraftStrategy, DraftStrategyFactory
from kronk_core.contract.errors import ConfigError, ModelNotFoundError
from kronk_core.contract.hookspecs import hookspec
from kronk_core.contract.kronk_view import KronkView
from kronk_core.contract.memory import Device, MemoryEstimate
from kronk_core.contract.records import ChatRecord, RequestRecord, current_request_id
from kronk_core.contract.registry import Register
from kronk_core.contract.sampling import Greedy, SamplerStage
from kronk_core.contract.templates import (
    TEMPLATE_PROCESSORS,
    TemplateProcessor,
    TemplateProcessorFactory,
)
from kronk_core.contract.types import SamplingParams, ToolSpec
from kronk_core.settings.sections import ModelSection
from kronk_llamacpp.packaged import GEMMA_MODEL_ID, GEMMA_MODEL_SETTINGS
from kronk_speculative.plugin import prompt_lookup
from kronk_templates.formats.base import ToolFormat
from kronk_templates.formats.hermes import HermesFormat
from kronk_testing import scripted
from kronk_testing.auth import bearer, mint, serving_with_auth
from kronk_testing.plugin import SCRIPTED_MODEL_ID, MakeKronk, MakeServer, ScriptedKronk
from kronk_testing.scripted import Script


class Teapot(Exception):
    pass


@get("/probe/teapot")
async def teapot() -> None:
    raise Teapot


def no_forbidden_header(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    if connection.headers.get("x-forbidden"):
        raise NotAuthorizedException("forbidden header")


def stamp(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-probe", b"1")]}
            await send(message)

        await app(scope, receive, send_stamped)

    return middleware


class Probe:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.records: list[RequestRecord] = []
        self.chats: list[ChatRecord] = []
        self.loads: list[tuple[str, str, float]] = []
        # The request id the engine thread had set while it reported each record.
        self.logged_ids: list[str | None] = []

    @hookimpl
    def kronk_app(self, app_config: AppConfig, kronk: Kronk) -> None:
        def handle(_: Request[Any, Any, Any], __: Teapot) -> Response[Any]:
            return Response({"error": {"message": "short and stout"}}, status_code=418)

        app_config.route_handlers.append(teapot)
        app_config.guards.append(no_forbidden_header)
        app_config.middleware.append(stamp)
        app_config.exception_handlers[Teapot] = handle
        app_config.lifespan.append(self.lifespan)

    @asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        # The app carries the server settings and room for the plugin's own state.
        app.state["probe_started_on"] = app.state.settings.api_host
        self.events.append("startup")
        yield
        assert app.state["probe_started_on"] == app.state.settings.api_host
        self.events.append("shutdown")

    @hookimpl
    def kronk_request_finished(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.logged_ids.append(current_request_id.get())

    @hookimpl
    def kronk_chat_finished(self, record: ChatRecord) -> None:
        self.chats.append(record)

    @hookimpl
    def kronk_model_loaded(
        self, model_config: ModelConfig, model_info: ModelInfo, seconds: float
    ) -> None:
        self.loads.append((model_config.id, model_info.id, seconds))

    @hookimpl
    def kronk_cli(self, group: click.Group) -> None:
        @group.command("hello")
        def hello() -> None:
            click.echo("hello from a plugin")


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Probe, Kronk]]:
    probe = Probe()
    config = KronkConfig(
        base_path=tmp_path_factory.mktemp("hooks"),
        default_model=GEMMA_MODEL_ID,
        models={GEMMA_MODEL_ID: ModelConfig.model_validate(GEMMA_MODEL_SETTINGS)},
    )
    kronk = Kronk(config, plugins={"probe": probe})
    yield probe, kronk
    kronk.close()


def test_server_hooks(probed: tuple[Probe, Kronk]) -> None:
    probe, kronk = probed
    app = create_app(ServerSettings(), kronk=kronk)
    body = {
        "model": GEMMA_MODEL_ID,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    with TestClient(app) as client:
        assert probe.events == ["startup"]
        teapot = client.get("/probe/teapot")
        assert teapot.status_code == 418 and teapot.json()["error"]["message"] == "short and stout"
        assert teapot.headers["x-probe"] == "1"
        assert client.get("/v1/liveness", headers={"x-forbidden": "1"}).status_code == 401
        answer = client.post("/v1/chat/completions", json=body, headers={"X-Request-ID": "r-9"})
        assert answer.status_code == 200
    assert probe.events == ["startup", "shutdown"]
    (record,) = probe.records
    assert record.model == GEMMA_MODEL_ID
    assert record.finish_reason == "length" and record.completion_tokens == 4
    assert record.prompt_tokens == answer.json()["usage"]["prompt_tokens"]
    assert record.total_seconds >= record.time_to_first_token > 0
    # The client's request id, in the record and around the engine's report.
    assert record.request_id == "r-9" and probe.logged_ids == ["r-9"]
    moments = [
        record.enqueued_at,
        record.started_at,
        record.cache_ready_at,
        record.prefilled_at,
        record.first_token_at,
        record.finished_at,
    ]
    assert moments[0] > 0 and moments == sorted(moments)
    assert record.prefill_tokens == record.prompt_tokens - record.cached_tokens
    assert record.tokens_per_second > 0 and record.slot >= 0
    (chat,) = probe.chats
    assert chat.request_id == "r-9" and chat.generation == record
    assert chat.finish_reason == "length" and chat.usage.completion_tokens == 4
    assert chat.started_at <= chat.prompt_started_at <= chat.prompt_ready_at
    assert chat.prompt_ready_at == record.enqueued_at <= record.finished_at <= chat.finished_at
    assert chat.tools == chat.tool_calls == 0 and chat.parse_seconds > 0
    # The first request loaded the model.
    ((config_id, info_id, seconds),) = probe.loads
    assert config_id == GEMMA_MODEL_ID and info_id and seconds > 0


def test_cli_hook_adds_a_command(probed: tuple[Probe, Kronk]) -> None:
    _, kronk = probed
    group = KronkGroup(name="kronk")
    kronk.hook.kronk_cli(group=group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and result.output == "hello from a plugin\n"


# ---- one example per hook ---------------------------------------------------------------
# Each test below is named test_hook_<hook> (tests/test_hook_docs.py checks that every hook
# spec has one) and reads as an example: a small plugin implementing just that hook,
# registered in-process, and what it changes, seen from outside. The models are scripted
# (kronk_testing.scripted): no llama.cpp, instant answers.

HI = [{"role": "user", "content": "Hi"}]


def _script_file(tmp_path: Path, name: str, reply: str = "scripted answer") -> Path:
    return scripted.write_script(tmp_path / "scripts" / f"{name}.json", Script(default=reply))


def test_hook_kronk_addhooks(make_kronk: MakeKronk) -> None:
    class GreetingSpecs:
        @hookspec
        def kronk_greeting(self, name: str) -> str:  # type: ignore[empty-body]
            """A hook of the plugin's own, which other plugins implement."""

    class DefinesTheHook:
        @hookimpl
        def kronk_addhooks(self, plugin_manager: pluggy.PluginManager) -> None:
            plugin_manager.add_hookspecs(GreetingSpecs)

    class ImplementsIt:
        @hookimpl
        def kronk_greeting(self, name: str) -> str:
            return f"hello, {name}"

    kronk = make_kronk(plugins={"defines": DefinesTheHook(), "implements": ImplementsIt()})
    assert kronk.hook.kronk_greeting(name="Kronk") == ["hello, Kronk"]


class Loudness(BaseModel):
    level: int = 1


LOUDNESS = ModelSection("loudness", Loudness)


def test_hook_kronk_settings(scripted_kronk: ScriptedKronk) -> None:
    class DeclaresASection:
        @hookimpl
        def kronk_settings(self) -> list[ModelSection[Loudness]]:
            return [LOUDNESS]

    plugins = {"loudness": DeclaresASection()}
    kronk = scripted_kronk({"m": {"loudness": {"level": 3}}}, plugins=plugins, load="m")
    loaded = kronk.get_loaded("m")
    assert loaded is not None and LOUDNESS.of(loaded.config).level == 3
    with pytest.raises(ConfigError, match=r"models\.m\.loudness\.level"):
        scripted_kronk({"m": {"loudness": {"level": "very"}}}, plugins=plugins, load="m")


async def test_hook_kronk_models(make_kronk: MakeKronk, tmp_path: Path) -> None:
    script = _script_file(tmp_path, "offered", "offered by a plugin")

    class OffersAModel:
        @hookimpl
        def kronk_models(self, kronk: KronkView) -> dict[str, dict[str, Any]]:
            return {"offered": {"backend": scripted.BACKEND, "model_path": str(script)}}

    kronk = make_kronk(plugins={"scripted": scripted, "offers": OffersAModel()})
    assert "offered" in kronk.models.ids()
    assert (await kronk.chat(HI, model="offered")).content == "offered by a plugin"


def test_hook_kronk_pull_hint(make_kronk: MakeKronk) -> None:
    class Hints:
        @hookimpl
        def kronk_pull_hint(self) -> str:
            return "Fetch it with `toy pull NAME`."

    kronk = make_kronk(plugins={"hints": Hints()})
    with pytest.raises(ModelNotFoundError) as refused:
        kronk.load("no-such-model")
    assert "Fetch it with `toy pull NAME`." in str(refused.value)


async def test_hook_kronk_resolve_model(scripted_kronk: ScriptedKronk) -> None:
    class Resolves:
        @hookimpl
        def kronk_resolve_model(self, kronk: KronkView, reference: str, pull: bool) -> str | None:
            return "m" if reference == "toy-org/toy-repo:Q4_0" else None

    kronk = scripted_kronk({"m": {}}, plugins={"resolves": Resolves()})
    assert kronk.models.resolve("toy-org/toy-repo:Q4_0") == "m"
    assert (await kronk.chat(HI, model="toy-org/toy-repo:Q4_0")).content


class ToyBackend(scripted.ScriptedBackend):
    """A backend of its own: `.toy` files (scripts) are its models, one package ships one,
    it has a device, and it reads facts and estimates from nothing."""

    DEVICE = Device(0, "TOY0", "a toy accelerator", "accel", 1 << 30, 2 << 30)
    ESTIMATE = MemoryEstimate(1 << 20, 256, 2, "f16", "f16", 4, 2048)
    FACTS = ModelFacts("toy", 7_000_000, "Q4_0", 2048)

    def __init__(self, shipped: Path) -> None:
        self.shipped = shipped
        self.loaded: list[str] = []

    def load_model(self, config: ModelConfig) -> scripted.ScriptedModel:
        self.loaded.append(config.id)
        return super().load_model(config)

    def model_file(self, path: Path) -> ModelFile | None:
        return ModelFile(path.stem, path, (path,)) if path.suffix == ".toy" else None

    def packaged_models(self) -> list[PackagedModel]:
        return [
            PackagedModel(
                id="boxed",
                install="pip install boxed-model",
                settings={},
                installed=lambda: True,
                assemble=lambda: self.shipped,
            )
        ]

    def devices(self) -> list[Device]:
        return [self.DEVICE]

    def memory_estimate(self, config: ModelConfig) -> MemoryEstimate | None:
        return self.ESTIMATE

    def model_facts(self, config: ModelConfig) -> ModelFacts | None:
        return self.FACTS


def _toy_file(path: Path, reply: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(Script(default=reply).to_json(), encoding="utf-8")
    return path


async def test_hook_kronk_register_backends(make_kronk: MakeKronk, tmp_path: Path) -> None:
    base = tmp_path / "home"
    _toy_file(base / "models" / "found.toy", "from a .toy file")
    toy = ToyBackend(_toy_file(tmp_path / "package" / "boxed.toy", "shipped in a package"))

    class RegistersABackend:
        @hookimpl
        def kronk_register_backends(self, register: Register[Backend], kronk: KronkView) -> None:
            register("toy", toy)

    script = _script_file(tmp_path, "named", "its backend named")
    models = {"named": {"backend": "toy", "model_path": str(script)}}
    kronk = make_kronk(models, plugins={"toy": RegistersABackend()}, base_path=base)
    # Its files under <base>/models and its package's model: served by id, loaded by it.
    assert {"found", "boxed"} <= set(kronk.models.ids())
    assert (await kronk.chat(HI, model="found")).content == "from a .toy file"
    assert (await kronk.chat(HI, model="boxed")).content == "shipped in a package"
    # A model whose `backend:` names it, whatever its file.
    assert (await kronk.chat(HI, model="named")).content == "its backend named"
    assert toy.loaded == ["found", "boxed", "named"]
    assert ToyBackend.DEVICE in kronk.models.devices()
    assert kronk.models.memory_estimate("found") == ToyBackend.ESTIMATE
    assert kronk.models.facts("named") == ToyBackend.FACTS


async def test_a_default_backend_loads_what_no_backend_recognises(
    make_kronk: MakeKronk, tmp_path: Path
) -> None:
    script = _script_file(tmp_path, "m", "the default backend's")

    class RegistersADefault:
        @hookimpl
        def kronk_register_backends(self, register: Register[Backend]) -> None:
            register("mine", scripted.ScriptedBackend(), default=True)

    kronk = make_kronk({"m": {"model_path": str(script)}}, plugins={"mine": RegistersADefault()})
    assert kronk.registry(BACKENDS).default == "mine"
    assert (await kronk.chat(HI, model="m")).content == "the default backend's"


def test_a_backend_no_plugin_registers_is_a_config_error(make_kronk: MakeKronk) -> None:
    kronk = make_kronk({"m": {"backend": "nowhere", "model_path": __file__}})
    with pytest.raises(ConfigError, match=r"models\.m\.backend: no active plugin registers"):
        kronk.load("m")


def test_hook_kronk_register_cache_strategies(scripted_kronk: ScriptedKronk) -> None:
    made: list[str] = []

    class RegistersACache:
        @hookimpl
        def kronk_register_cache_strategies(
            self, register: Register[CacheStrategyFactory], kronk: KronkView
        ) -> None:
            def forgetful(*, model_config: ModelConfig, model_info: ModelInfo) -> CacheStrategy:
                made.append(model_config.id)
                return no_cache(model_config=model_config, model_info=model_info)

            register("forgetful", forgetful)

    plugins = {"forgetful": RegistersACache()}
    kronk = scripted_kronk({"m": {"cache": "forgetful"}}, plugins=plugins, load="m")
    loaded = kronk.get_loaded("m")
    assert made == ["m"] and loaded is not None


def test_hook_kronk_register_draft_strategies(scripted_kronk: ScriptedKronk) -> None:
    made: list[str] = []

    class RegistersADrafter:
        @hookimpl
        def kronk_register_draft_strategies(
            self, register: Register[DraftStrategyFactory], kronk: KronkView
        ) -> None:
            def echo(**arguments: Any) -> DraftStrategy:
                made.append(arguments["model_config"].id)
                return prompt_lookup(**arguments)

            register("echo", echo)

    plugins = {"echo": RegistersADrafter()}
    kronk = scripted_kronk({"m": {"draft_strategy": "echo"}}, plugins=plugins, load="m")
    loaded = kronk.get_loaded("m")
    assert made == ["m"]
    assert loaded is not None and loaded.engine is not None
    assert loaded.engine.draft_strategy is not None


async def test_hook_kronk_register_template_processors(scripted_kronk: ScriptedKronk) -> None:
    rendered: list[int] = []

    class Counting:
        """The jinja processor, counting the prompts it renders."""

        def __init__(self, inner: TemplateProcessor) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def render(self, *args: Any, **kwargs: Any) -> Any:
            rendered.append(1)
            return self._inner.render(*args, **kwargs)

    class RegistersAProcessor:
        @hookimpl
        def kronk_register_template_processors(
            self, register: Register[TemplateProcessorFactory], kronk: KronkView
        ) -> None:
            def counting(**arguments: Any) -> TemplateProcessor:
                # Looked up at load time: the registry is being filled while this hook runs.
                jinja = kronk.registry(TEMPLATE_PROCESSORS).get("jinja", "template_processor")
                return Counting(jinja(**arguments))

            register("counting", counting)

    plugins = {"counting": RegistersAProcessor()}
    kronk = scripted_kronk({"m": {"template_processor": "counting"}}, plugins=plugins)
    assert (await kronk.chat(HI, model="m")).content
    assert rendered


async def test_hook_kronk_sampler_stages(scripted_kronk: ScriptedKronk) -> None:
    asked: list[float] = []

    class ChoosesStages:
        @hookimpl
        def kronk_sampler_stages(
            self, params: SamplingParams, model_info: ModelInfo
        ) -> list[SamplerStage]:
            asked.append(params.temperature)
            return [Greedy()]

    kronk = scripted_kronk({"m": {}}, plugins={"stages": ChoosesStages()})
    await kronk.chat(HI, model="m", temperature=0.7)
    assert asked[-1] == 0.7  # the request's own, resolved


async def test_hook_kronk_app(scripted_kronk: ScriptedKronk, make_server: MakeServer) -> None:
    @get("/probe/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "from a plugin"}

    class AddsARoute:
        @hookimpl
        def kronk_app(self, app_config: AppConfig, kronk: KronkView) -> None:
            app_config.route_handlers.append(hello)

    server = make_server(scripted_kronk(plugins={"adds": AddsARoute()}))
    answer = httpx.get(server.base_url + "/probe/hello", timeout=30)
    assert answer.status_code == 200 and answer.json() == {"hello": "from a plugin"}


async def test_hook_kronk_request_finished(scripted_kronk: ScriptedKronk) -> None:
    records: list[RequestRecord] = []

    class Watches:
        @hookimpl
        def kronk_request_finished(self, record: RequestRecord) -> None:
            records.append(record)

    kronk = scripted_kronk({"m": {}}, plugins={"watches": Watches()}, script=Script(default="four"))
    answer = await kronk.chat(HI, model="m")
    ((record,),) = [records]
    assert record.model == "m" and record.completion_tokens == answer.usage.completion_tokens


async def test_hook_kronk_chat_finished(scripted_kronk: ScriptedKronk) -> None:
    records: list[ChatRecord] = []

    class Watches:
        @hookimpl
        def kronk_chat_finished(self, record: ChatRecord) -> None:
            records.append(record)

    kronk = scripted_kronk({"m": {}}, plugins={"watches": Watches()})
    answer = await kronk.chat(HI, model="m")
    (record,) = records
    assert record.finish_reason == answer.finish_reason and record.usage == answer.usage


def test_hook_kronk_model_loaded(scripted_kronk: ScriptedKronk) -> None:
    loads: list[tuple[str, float]] = []

    class Watches:
        @hookimpl
        def kronk_model_loaded(
            self, model_config: ModelConfig, model_info: ModelInfo, seconds: float
        ) -> None:
            loads.append((model_config.id, seconds))

    scripted_kronk({"m": {}}, plugins={"watches": Watches()}, load="m")
    ((model, seconds),) = loads
    assert model == "m" and seconds >= 0


def test_hook_kronk_cli(make_kronk: MakeKronk) -> None:
    class AddsACommand:
        @hookimpl
        def kronk_cli(self, group: click.Group) -> None:
            @group.command("hello")
            def hello() -> None:
                click.echo("hello from a plugin")

    kronk = make_kronk(plugins={"adds": AddsACommand()})
    group = KronkGroup(name="kronk")
    kronk.hook.kronk_cli(group=group)
    result = CliRunner().invoke(group, ["hello"])
    assert result.exit_code == 0 and result.output == "hello from a plugin\n"


def test_hook_kronk_register_limit_stores(scripted_kronk: ScriptedKronk) -> None:
    opened: list[str] = []

    class RegistersAStore:
        @hookimpl(optionalhook=True)
        def kronk_register_limit_stores(
            self, register: Register[LimitStoreFactory], kronk: KronkView
        ) -> None:
            def counted(url: str, base_path: Path) -> LimitStore:
                opened.append(url)
                return sqlite_store(f"sqlite:///{base_path / 'counted.db'}", base_path)

            register("counted", counted)

    kronk = scripted_kronk(plugins={"counted": RegistersAStore()})
    with serving_with_auth(kronk, auth={"limit_store": "counted://a"}) as server:
        headers = bearer(mint(server, "chat-completions:1/day"))
        url = f"{server.base_url}/v1/chat/completions"
        body = {"model": SCRIPTED_MODEL_ID, "messages": HI}
        first = httpx.post(url, json=body, headers=headers, timeout=30)
        again = httpx.post(url, json=body, headers=headers, timeout=30)
    assert opened == ["counted://a"]
    assert (first.status_code, again.status_code) == (200, 429)


def test_hook_kronk_debug_collectors(
    scripted_kronk: ScriptedKronk, make_server: MakeServer, port_finder: Callable[[], int]
) -> None:
    class Answers:
        def collect(self) -> Iterator[GaugeMetricFamily]:
            yield GaugeMetricFamily("kronk_toy_answer", "The answer.", value=42)

    class AddsACollector:
        @hookimpl(optionalhook=True)
        def kronk_debug_collectors(self, kronk: Kronk) -> list[Answers]:
            return [Answers()]

    kronk = scripted_kronk(plugins={"answers": AddsACollector()})
    port = port_finder()
    settings = ServerSettings.model_validate({"debug": {"host": f"127.0.0.1:{port}"}})
    make_server(kronk, settings, lifespan="on")
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert "kronk_toy_answer 42.0" in metrics.text


async def test_hook_kronk_register_tool_formats(scripted_kronk: ScriptedKronk) -> None:
    class Bracketed(HermesFormat):
        """Hermes' calls, under a name of this plugin's."""

        name = "bracketed"

    class RegistersAFormat:
        @hookimpl(optionalhook=True)
        def kronk_register_tool_formats(
            self, register: Register[ToolFormat], kronk: KronkView
        ) -> None:
            register("bracketed", Bracketed())

    call = '<tool_call>\n{"name": "lookup", "arguments": {"q": "tea"}}\n</tool_call>'
    kronk = scripted_kronk(
        {"m": {"templates": {"tool_format": "bracketed"}}},
        plugins={"formats": RegistersAFormat()},
        script=Script(default=call),
    )
    tool = ToolSpec(name="lookup", parameters_json='{"type": "object"}')
    answer = await kronk.chat(HI, model="m", tools=[tool])
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [
        ("lookup", {"q": "tea"})
    ]
