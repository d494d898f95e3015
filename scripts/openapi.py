"""docs/openapi.json: the OpenAPI 3.1 document of every route the server answers.

It is generated from the app `kronk server start` builds (`kronk_api.app.create_app`, default
settings) with every built-in plugin active (each directory under plugins/) and no model
loaded. Litestar writes the paths, methods, parameters and declared response types; on top:

- a handler's docstring is its operation's description, the docstring's first sentence its
  summary (without a docstring, the handler's name is);
- a handler that reads its JSON body as a pydantic model (`parse_body(request, Model)` or
  `receive(request, Model)`, or `Model.model_validate` of `request.body()`) gets the model's
  JSON schema as its requestBody: found in the handler's code, so a new route needs no table
  entry;
- each operation is tagged with the plugin that serves it (`server`: kronk_api itself);
- errors are described once, as each API's error shape (docs/api.md#errors), not as
  Litestar's validation error, which Kronk never sends.

Routes marked `include_in_schema=False` (the browser UI's pages, /metrics) are left out; so
are the MCP and debug services, which listen on ports of their own.

Usage: python scripts/openapi.py           write docs/openapi.json
       python scripts/openapi.py --check   exit 1 when docs/openapi.json differs from a fresh
                                           generation (`nox -s docs` runs this)
It needs kronk and the built-in plugins installed (as the quick, lint and docs sessions do).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Callable
from functools import reduce
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Server
from litestar.routes import HTTPRoute
from litestar.utils.sync import AsyncCallable
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from kronk_api.app import create_app
from kronk_api.settings import ServerSettings
from kronk_core import Kronk, __version__
from kronk_core.contract.plugins import hookimpl, registered_plugins
from kronk_core.settings.config import KronkConfig

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "openapi.json"
REGENERATE = "python scripts/openapi.py"
# The in-process plugin that turns Litestar's OpenAPI generation on for this app only.
SWITCH = "openapi-document"
# kronk_api's own routes (health, readiness, operator routes).
SERVER_TAG = "server"
ERROR = (
    "An error, in the error shape of the route's API: OpenAI's `{\"error\": {...}}`, "
    "Anthropic's on /v1/messages, Ollama's on /api/... (docs/api.md#errors)."
)


def built_in_plugins() -> dict[str, tuple[str, str]]:
    """Each built-in plugin's entry-point name -> (its top-level package, its description),
    from plugins/*/pyproject.toml: the rule nox and the `all` extra follow."""
    plugins: dict[str, tuple[str, str]] = {}
    for project_file in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        project = tomllib.loads(project_file.read_text(encoding="utf-8"))["project"]
        for name, target in project["entry-points"]["kronk"].items():
            plugins[name] = (target.split(".")[0], project["description"])
    return plugins


class _Switch:
    """Gives the app an OpenAPI config, which the server itself never has (it serves no
    schema): the document comes from the same routes, guards and plugins."""

    @hookimpl
    def kronk_app(self, app_config: AppConfig) -> None:
        app_config.openapi_config = OpenAPIConfig(
            title="Kronk for Python",
            version=__version__,
            description=(
                "The HTTP API of `kronk server start` with every built-in plugin active, "
                f"generated from its routes by `{REGENERATE}`."
            ),
            servers=[Server(url=f"http://{ServerSettings().api_host}")],
            use_handler_docstrings=True,
        )


def document() -> dict[str, Any]:
    """The OpenAPI document, as a JSON-ready mapping."""
    plugins = built_in_plugins()
    with tempfile.TemporaryDirectory() as base:
        wanted = {*plugins, SWITCH}
        config = KronkConfig.model_validate(
            {"base_path": base, "plugins": {"enabled": sorted(wanted)}}
        )
        kronk = Kronk(config, plugins={SWITCH: _Switch()})
        try:
            active = set(registered_plugins(kronk.plugins))
            missing, extra = sorted(wanted - active), sorted(active - wanted)
            if missing or extra:
                raise SystemExit(
                    "the document needs exactly the built-in plugins, active: "
                    f"missing {missing}, extra {extra} (are they installed? is KRONK_PLUGINS "
                    "or KRONK_DISABLE_PLUGINS set?)"
                )
            app = create_app(ServerSettings(base_path=Path(base)), kronk=kronk)
            return _complete(app, app.openapi_schema.to_schema(), plugins)
        finally:
            kronk.close()


def _complete(
    app: Litestar, schema: dict[str, Any], plugins: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    """Litestar's document with the summaries, request bodies, tags and errors above."""
    tags = {package: name for name, (package, _) in plugins.items()}
    tags["kronk_api"] = SERVER_TAG
    bodies: dict[tuple[str, str], type[BaseModel]] = {}
    used_tags: set[str] = set()
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            if not handler.resolve_include_in_schema():
                continue
            function = _function(handler)
            tag = tags[function.__module__.split(".")[0]]
            used_tags.add(tag)
            model = body_model(function)
            for method in sorted(handler.http_methods):
                operation = schema["paths"][route.path_format][method.lower()]
                _describe(operation, function)
                operation["tags"] = [tag]
                responses = operation["responses"]
                if not handler.raises and not handler.responses:
                    # Litestar's ValidationException body: Kronk's dialects answer their own.
                    responses.pop("400", None)
                responses["default"] = {"description": ERROR}
                if model is not None:
                    bodies[(route.path_format, method.lower())] = model
    _add_bodies(schema, bodies)
    descriptions = {name: description for name, (_, description) in plugins.items()}
    descriptions[SERVER_TAG] = "The server's own routes (kronk_api): health, operator routes"
    schema["tags"] = [{"name": tag, "description": descriptions[tag]} for tag in sorted(used_tags)]
    return schema


def _function(handler: HTTPRouteHandler) -> Callable[..., Any]:
    """The handler's own function (Litestar wraps a sync handler run in a thread)."""
    function = handler.fn
    return function.func if isinstance(function, AsyncCallable) else function


_SENTENCE_END = re.compile(r"(?<=\.)\s")


def _describe(operation: dict[str, Any], function: Callable[..., Any]) -> None:
    docstring = inspect.getdoc(function)
    if docstring is None:
        operation.pop("description", None)
        operation["summary"] = function.__name__.replace("_", " ").capitalize()
        return
    operation["description"] = docstring
    first_paragraph = " ".join(docstring.split("\n\n")[0].split())
    operation["summary"] = _SENTENCE_END.split(first_paragraph, maxsplit=1)[0]


def body_model(function: Callable[..., Any]) -> type[BaseModel] | None:
    """The model the handler reads its JSON body as, found in its code: the second argument
    of `parse_body(request, Model)` (kronk_api.http) or of `receive(request, Model)` (the
    dialects' prologue, kronk_api.dialect), or `Model.model_validate(...)` of what
    `request.body()` returned; looked up in the handler's module."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    models: set[type[BaseModel]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _callee(node) in ("parse_body", "receive"):
            if len(node.args) != 2:
                raise ValueError(f"{function.__qualname__}: {_callee(node)} without a model")
            models.add(_model(node.args[1], function))
        elif (
            _callee(node) == "model_validate"
            and isinstance(node.func, ast.Attribute)
            and any(
                isinstance(inner, ast.Call) and _callee(inner) == "body" for inner in ast.walk(node)
            )
        ):
            models.add(_model(node.func.value, function))
    if len(models) > 1:
        raise ValueError(f"{function.__qualname__} reads its body as {sorted(map(str, models))}")
    return models.pop() if models else None


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return call.func.id if isinstance(call.func, ast.Name) else None


def _model(expression: ast.expr, function: Callable[..., Any]) -> type[BaseModel]:
    """`Model` or `module.Model` in the handler's code, as the class it names there."""
    first, *attributes = ast.unparse(expression).split(".")
    model = reduce(getattr, attributes, function.__globals__[first])
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"{function.__qualname__}: its body's {model!r} is no pydantic model")
    return model


def _add_bodies(schema: dict[str, Any], bodies: dict[tuple[str, str], type[BaseModel]]) -> None:
    """Each operation's body schema; the models' definitions in components (pydantic names
    them, qualifying a name two models share)."""
    models = sorted(set(bodies.values()), key=lambda model: (model.__module__, model.__name__))
    references, definitions = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.get("$defs", {}).items():
        if components.setdefault(name, definition) != definition:
            raise ValueError(f"two schemas named {name} in components")
    for (path, method), model in bodies.items():
        schema["paths"][path][method]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": references[(model, "validation")]}},
        }


def render(mapping: dict[str, Any]) -> str:
    """Sorted keys, two-space indents, a final newline: a route's change is a small diff."""
    return json.dumps(mapping, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with docs/openapi.json, write nothing"
    )
    check = parser.parse_args().check
    fresh = render(document())
    if not check:
        DOCUMENT.write_text(fresh, encoding="utf-8")
        print(f"wrote {DOCUMENT.relative_to(ROOT)}")
        return 0
    committed = DOCUMENT.read_text(encoding="utf-8") if DOCUMENT.is_file() else ""
    if committed != fresh:
        print(
            f"{DOCUMENT.relative_to(ROOT)} is not what the routes generate: "
            f"regenerate it with `{REGENERATE}` and commit it (any environment with kronk "
            "and the built-in plugins runs it: `.nox/docs/bin/python` after `nox -s docs`)",
            file=sys.stderr,
        )
        return 1
    print(f"{DOCUMENT.relative_to(ROOT)} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
