"""Pydantic models of the embeddings and rerank requests."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingsRequest(BaseModel):
    """POST /v1/embeddings, as OpenAI defines it, plus Kronk's `truncate`."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    truncate: bool = False
    user: str | None = None


class RerankDocument(BaseModel):
    text: str


class RerankRequest(BaseModel):
    """POST /v1/rerank: documents as strings or {"text": ...} objects."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    query: str
    documents: Annotated[list[str | RerankDocument], Field(min_length=1)]
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = True

    def texts(self) -> list[str]:
        return [doc if isinstance(doc, str) else doc.text for doc in self.documents]
