"""POST /v1/embeddings, /v1/rerank and /v1/reranking; errors in OpenAI's shape."""

from __future__ import annotations

import base64
import struct
from typing import Any

from litestar import Request, Router, post

from kronk_api.contract import Dialect, receive
from kronk_embeddings.schemas import EmbeddingsRequest, RerankRequest


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    # OpenAI's base64 form: the raw little-endian float32 array.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _usage(prompt_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}


@post("/v1/embeddings", status_code=200, opt={"kronk_endpoint": "embeddings"})
async def embeddings(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """OpenAI embeddings: one vector per input text or token list."""
    received = await receive(request, EmbeddingsRequest)
    body = received.body
    result = await received.kronk.embed(
        body.input, model=body.model, dimensions=body.dimensions, truncate=body.truncate
    )
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": _encode(vector, body.encoding_format),
            }
            for index, vector in enumerate(result.vectors)
        ],
        "model": result.model,
        "usage": _usage(result.prompt_tokens),
    }


@post(["/v1/rerank", "/v1/reranking"], status_code=200, opt={"kronk_endpoint": "rerank"})
async def rerank(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Rerank documents against a query: a relevance score for each, best first."""
    received = await receive(request, RerankRequest)
    body = received.body
    result = await received.kronk.rerank(
        body.query, body.texts(), model=body.model, top_n=body.top_n
    )
    results = []
    for ranked in result.results:
        item: dict[str, Any] = {"index": ranked.index, "relevance_score": ranked.relevance_score}
        if body.return_documents:
            item["document"] = ranked.document
        results.append(item)
    return {
        "object": "list",
        "results": results,
        "model": result.model,
        "usage": _usage(result.prompt_tokens),
    }


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[embeddings, rerank],
        # The server's own error shape, which is OpenAI's (the embeddings API is OpenAI's).
        exception_handlers=Dialect().exception_handlers(),
    )
