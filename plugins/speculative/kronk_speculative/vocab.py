"""Whether a draft model speaks its target's vocabulary: the same token id, the same text."""

from __future__ import annotations

from kronk_core.contract import ConfigError, StrategyModel


def describe(model: StrategyModel) -> str:
    """A vocabulary as a person recognises it: tokenizer kind, pre-tokenizer, size."""
    meta = model.info.metadata
    kind = meta.get("tokenizer.ggml.model", "unknown")
    pre = meta.get("tokenizer.ggml.pre")
    return f"{kind} tokenizer{f' ({pre})' if pre else ''}, {model.info.n_vocab} tokens"


def first_difference(target: StrategyModel, draft: StrategyModel) -> int | None:
    """The first token id whose text differs, or None when every token is the same."""
    for token in range(min(target.info.n_vocab, draft.info.n_vocab)):
        if target.token_text(token) != draft.token_text(token):
            return token
    return None


def check_vocabulary(target: StrategyModel, draft: StrategyModel, key: str) -> None:
    """ConfigError naming both vocabularies unless every token id means the same in both."""
    mismatch = target.info.n_vocab != draft.info.n_vocab
    token = None if mismatch else first_difference(target, draft)
    if not mismatch and token is None:
        return
    detail = ""
    if token is not None:
        detail = (
            f"; token {token} is {target.token_text(token)!r} in one and "
            f"{draft.token_text(token)!r} in the other"
        )
    raise ConfigError(
        key,
        f"the draft model {draft.info.id!r} does not share the vocabulary of {target.info.id!r}: "
        f"{target.info.id!r} has a {describe(target)}, {draft.info.id!r} has a "
        f"{describe(draft)}{detail}. A draft must use the same tokenizer",
    )
