"""What clients send beyond what a dialect serves, treated by one rule in every dialect.

Each dialect states, in one place, the request fields it accepts and ignores (each with
why the answer does not depend on it) and the fields it refuses (they would change the
answer and Kronk cannot honour them: 400). Any other unknown field is accepted and logged
once per server. A built-in tool Kronk can serve with a server tool (`server_tools`, which
plugins offer through `kronk_server_tools`) is served; one it cannot serve is left out of the
prompt, named in the OMITTED_TOOLS_HEADER response header and logged once per tool type, so
an agent that offers it keeps working.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from litestar import Request

from kronk_api.http import kronk_of
from kronk_core.contract.server_tools import ServerTool

log = logging.getLogger(__name__)

OMITTED_TOOLS_HEADER = "x-kronk-omitted-tools"
_NOTICED = "kronk_client_extras_noticed"
_SERVER_TOOLS = "kronk_server_tools"


class ToolPlan(Protocol):
    """A dialect's plan of a request's tools: the types server tools serve (each with its
    server tool's name) and the types left out."""

    @property
    def served(self) -> Mapping[str, str]: ...

    @property
    def omitted(self) -> Sequence[str]: ...


Plan = TypeVar("Plan", bound=ToolPlan, covariant=True)


class PlansTools(Protocol[Plan]):
    """A request body with fields beyond its schema's and a plan of its tools."""

    @property
    def model_extra(self) -> dict[str, Any] | None: ...

    def tool_plan(self, available: Mapping[str, ServerTool] | None = None) -> Plan: ...


@dataclass(frozen=True)
class FieldRules:
    """A dialect's rule for top-level request fields it does not model."""

    dialect: str
    # Field → why it does not change the answer.
    ignored: Mapping[str, str]
    # Field → why it is refused and what to send instead; refused only when it asks for
    # something (absent, null, false and empty values ask for nothing).
    refused: Mapping[str, str]

    def refuse(self, fields: Mapping[str, Any]) -> None:
        """ValueError (a 400 naming the field) for the first refused field that asks."""
        for name, why in self.refused.items():
            if fields.get(name) not in (None, False, "", [], {}):
                raise ValueError(f"{name}: {why}")

    def unknown(self, fields: Iterable[str]) -> list[str]:
        """The fields neither ignored nor refused by name, in the order given."""
        return [name for name in fields if name not in self.ignored and name not in self.refused]


def notice_once(
    request: Request[Any, Any, Any], kind: str, names: Iterable[str], what: str, level: int
) -> None:
    """Log `what` (formatted with the name) once per server for each new (kind, name): an
    agent sends the same extras with every request, and one line says all there is."""
    noticed: set[tuple[str, str]] = request.app.state.setdefault(_NOTICED, set())
    for name in names:
        if (kind, name) not in noticed:
            noticed.add((kind, name))
            log.log(level, what, name)


def unknown_fields(
    request: Request[Any, Any, Any], rules: FieldRules, fields: Iterable[str]
) -> None:
    """Log each unknown field of a request once (it was accepted and ignored)."""
    notice_once(
        request,
        f"{rules.dialect} field",
        rules.unknown(fields),
        f"{rules.dialect}: request field %r is not known to Kronk; it is accepted and ignored",
        logging.INFO,
    )


def omitted_tools(
    request: Request[Any, Any, Any], dialect: str, types: Sequence[str]
) -> dict[str, str]:
    """Log each omitted tool type once; the response headers that name them."""
    notice_once(
        request,
        "tool",
        types,
        f"{dialect}: tools of type %r cannot be served here; they are left out of the prompt "
        f"(the response header {OMITTED_TOOLS_HEADER} names them)",
        logging.WARNING,
    )
    return {OMITTED_TOOLS_HEADER: ",".join(dict.fromkeys(types))} if types else {}


def server_tools(request: Request[Any, Any, Any]) -> Mapping[str, ServerTool]:
    """The server tools the active plugins offer (`kronk_server_tools`), by name; asked once
    per server, with its settings. The first tool of a name wins."""
    state = request.app.state
    found: dict[str, ServerTool] | None = state.get(_SERVER_TOOLS)
    if found is None:
        kronk = kronk_of(request)
        found = {}
        for answer in kronk.hook.kronk_server_tools(settings=state.settings, kronk=kronk):
            for tool in answer or ():
                found.setdefault(tool.name, tool)
        state[_SERVER_TOOLS] = found
    return found


def served_tools(request: Request[Any, Any, Any], dialect: str, served: Mapping[str, str]) -> None:
    """Log once per tool type that Kronk serves it: `served` maps each type to its server
    tool's name."""
    for kind, name in served.items():
        notice_once(
            request,
            "served tool",
            [kind],
            f"{dialect}: tools of type %r are served by Kronk's {name} server tool",
            logging.INFO,
        )


def client_extras(
    request: Request[Any, Any, Any], rules: FieldRules, body: PlansTools[Plan]
) -> tuple[Plan, dict[str, str]]:
    """What the request holds beyond what Kronk serves, logged once: its unknown fields,
    and the plan of its tools with the server tools that serve its built-in ones; with the
    response headers that name the tools left out."""
    unknown_fields(request, rules, body.model_extra or {})
    plan = body.tool_plan(server_tools(request))
    served_tools(request, rules.dialect, plan.served)
    return plan, omitted_tools(request, rules.dialect, plan.omitted)
