"""llama-server's /lora-adapters: a model's LoRA adapters and the scales its requests get
(`?model=`, Kronk's addition: llama-server serves one model; unset, the default one)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.params import FromQuery
from pydantic import RootModel

from kronk_api.contract import ADMIN, AUTHENTICATED, ENDPOINT_OPT, kronk_of, parse_body
from kronk_core.contract import AdapterInfo, InvalidRequestError
from kronk_openai.schemas import LoraScale


class LoraScales(RootModel[list[LoraScale]]):
    """POST /lora-adapters' body: `[{"id": 0, "scale": 0.5}, ...]`."""


def _listed(adapters: list[AdapterInfo]) -> list[dict[str, Any]]:
    return [{"id": a.id, "path": a.path, "scale": a.scale} for a in adapters]


@get("/lora-adapters", opt={ENDPOINT_OPT: AUTHENTICATED})
async def lora_adapters(
    request: Request[Any, Any, Any], model: FromQuery[str | None] = None
) -> Any:
    """The model's LoRA adapters and their scales (llama-server's route)."""
    return _listed(await kronk_of(request).lora_adapters(model=model))


@post("/lora-adapters", status_code=200, opt={ENDPOINT_OPT: ADMIN})
async def set_lora_adapters(
    request: Request[Any, Any, Any], model: FromQuery[str | None] = None
) -> dict[str, Any]:
    """The scales later requests get (adapters not listed: 0), as llama-server's."""
    body: LoraScales = await parse_body(request, LoraScales)
    scales = {entry.id: entry.scale for entry in body.root}
    if len(scales) < len(body.root):
        raise InvalidRequestError("lora: an adapter is listed twice", param="lora")
    await kronk_of(request).set_lora_adapters(scales, model=model)
    return {"success": True}


LORA_ROUTES = [lora_adapters, set_lora_adapters]
