"""Prompt preparation: a chat request into the tokens, limits and sampling the engine runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kronk_core.contract.cache import PromptScope
from kronk_core.contract.errors import ContextOverflowError, InvalidRequestError
from kronk_core.contract.generation import GenerationRequest
from kronk_core.contract.media import Media, MediaPrompt, MediaSpan
from kronk_core.contract.sampling import resolve_sampling
from kronk_core.contract.templates import OutputParser, PlainText, RenderOptions
from kronk_core.contract.types import (
    DEFAULT_MAX_TOKENS,
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    SamplingParams,
)
from kronk_core.infill import infill_tokens
from kronk_core.inputs import forces_call
from kronk_core.runtime.loading import LoadedModel
from kronk_core.settings.config import ContextOverflow


@dataclass(frozen=True, slots=True)
class PreparedChat:
    """What the engine runs for one chat request, and how to read its output."""

    generation: GenerationRequest
    parser: OutputParser
    dropped_tokens: int
    # The rendered prompt (a chat's template output, a completion's text); "" for token ids.
    prompt_text: str = ""
    # A parser like `parser` for each further choice of the request (n > 1).
    more_parsers: tuple[OutputParser, ...] = ()


def render_options(request: ChatRequest, *, add_generation_prompt: bool = True) -> RenderOptions:
    thinking = request.enable_thinking
    if request.grammar or request.json_schema or forces_call(request):
        thinking = False  # a grammar applies from the first generated token
    if request.continue_final_message:
        thinking = False  # the answer goes on with the message's text, not with reasoning
    return RenderOptions(
        add_generation_prompt=add_generation_prompt or request.continue_final_message,
        enable_thinking=True if thinking is None else thinking,
        reasoning_effort=request.reasoning_effort,
        tools=() if request.tool_choice.mode == "none" else request.tools,
        template_kwargs=dict(request.template_kwargs),
    )


def prepare_chat(loaded: LoadedModel, request: ChatRequest, scope: PromptScope) -> PreparedChat:
    """Render, fit into the context and resolve sampling; everything that can fail does here."""
    options = render_options(request)
    messages = loaded.cache.prompt_messages(request.messages, scope)
    prompt_text = render_prompt(loaded, messages, options, request)
    rendered = loaded.prompt(prompt_text, media_of(messages))
    dropped = 0
    if loaded.config.context_overflow is ContextOverflow.trim:
        messages, trimmed = _trim_to_fit(loaded, messages, options, request, len(rendered.tokens))
        if trimmed is not None:
            dropped, rendered = len(rendered.tokens) - len(trimmed.tokens), trimmed
            prompt_text = render_prompt(loaded, messages, options, request)
    prompt = rendered.tokens
    if rendered.spans and rendered.spans[-1].end == len(prompt):
        raise InvalidRequestError("a prompt must not end with an image or sound", param="messages")
    system_tokens = 0
    if loaded.cache.needs_system_tokens:
        system_tokens = _system_tokens(loaded, messages, options, prompt)
    sampling = _with_logit_bias(
        loaded, resolve_sampling(request.sampling, loaded.config.sampling), request.logit_bias
    )
    if request.grammar or request.json_schema:
        sampling = replace(sampling, grammar=request.grammar, json_schema=request.json_schema)
    elif forces_call(request):
        # A named function is one call; "required" may make several when allowed.
        several = request.parallel_tool_calls and request.tool_choice.mode == "required"
        constraint = loaded.template.tool_constraint(request.tools, request.tool_choice, several)
        if isinstance(constraint, str):
            sampling = replace(sampling, grammar=constraint)
        else:
            sampling = replace(sampling, structured=constraint)
    keep = _shift_keep(loaded, request.n_keep, prompt, rendered.spans)
    generation = GenerationRequest(
        prompt_tokens=prompt,
        sampling=sampling,
        max_tokens=_max_tokens(loaded, request.max_tokens, len(prompt), "messages", keep),
        stop=request.stop,
        end_strings=tuple(loaded.config.stop),
        end_tokens=loaded.end_tokens,
        logprobs=request.logprobs or request.top_logprobs > 0,
        top_logprobs=request.top_logprobs,
        system_tokens=system_tokens,
        special_tokens_as_text=loaded.template.special_tokens_as_text,
        media=rendered.spans,
        shift_keep=keep,
        adapters=loaded.adapters_for(request.lora),
    )
    parser, *more = (loaded.template.parser(options, prompt_text) for _ in range(request.n))
    return PreparedChat(generation, parser, dropped, prompt_text, tuple(more))


def prepare_completion(loaded: LoadedModel, request: CompletionRequest) -> PreparedChat:
    """A raw prompt's tokens (text gets the model's BOS, special-token text is parsed; ids
    are taken as they are), its limits and sampling; its output is plain text."""
    if request.infill is not None:
        if not isinstance(request.prompt, str):
            raise InvalidRequestError("a fill-in-the-middle prompt is text", param="prompt")
        # The answer's room first (a quarter of the window unless asked), the code the rest.
        answer = request.max_tokens or loaded.info.n_ctx_per_seq // 4
        room = max(0, loaded.info.n_ctx_per_seq - answer)
        fim = loaded.info.fim
        prompt = infill_tokens(loaded.model, fim, request.prompt, request.infill, room)
    elif isinstance(request.prompt, str):
        prompt = loaded.model.tokenize(request.prompt, add_special=True, parse_special=True)
    else:
        prompt = list(request.prompt)
        check_vocabulary(loaded, prompt, "prompt")
    keep = _shift_keep(loaded, request.n_keep, prompt, ())
    generation = GenerationRequest(
        prompt_tokens=tuple(prompt),
        sampling=_with_logit_bias(
            loaded, resolve_sampling(request.sampling, loaded.config.sampling), request.logit_bias
        ),
        max_tokens=_max_tokens(loaded, request.max_tokens, len(prompt), "prompt", keep),
        stop=request.stop,
        end_strings=tuple(loaded.config.stop),
        logprobs=request.logprobs or request.top_logprobs > 0,
        top_logprobs=request.top_logprobs,
        shift_keep=keep,
        adapters=loaded.adapters_for(request.lora),
    )
    if request.infill is not None:  # what the model read, its FIM tokens spelled out
        spelled = b"".join(loaded.model.token_bytes(token, special=True) for token in prompt)
        text = spelled.decode("utf-8", errors="replace")
    else:
        text = request.prompt if isinstance(request.prompt, str) else ""
    more = tuple(PlainText() for _ in range(request.n - 1))
    return PreparedChat(generation, PlainText(), 0, text, more)


def prompt_tokens(
    loaded: LoadedModel, request: ChatRequest, scope: PromptScope, *, add_generation_prompt: bool
) -> tuple[int, ...]:
    """The prompt's tokens as a chat would run it (media positions hold pseudo-tokens)."""
    options = render_options(request, add_generation_prompt=add_generation_prompt)
    messages = loaded.cache.prompt_messages(request.messages, scope)
    text = render_prompt(loaded, messages, options, request)
    return tuple(loaded.prompt(text, media_of(messages)).tokens)


def media_of(messages: Sequence[ChatMessage]) -> tuple[Media, ...]:
    """The messages' images and sounds in the order the prompt holds them."""
    return tuple(item for message in messages for item in message.media)


def render_prompt(
    loaded: LoadedModel,
    messages: Sequence[ChatMessage],
    options: RenderOptions,
    request: ChatRequest,
) -> str:
    """The prompt's text. A continued final message is its text after the generation prompt
    of the messages before it: templates close every message they render, and some trim
    or rewrite its text, so it is not given to the template."""
    if not request.continue_final_message:
        return loaded.template.render(messages, options)
    *head, final = messages
    if not head:
        raise InvalidRequestError(
            "continue_final_message: the assistant message to continue needs a message before it",
            param="messages",
        )
    return loaded.template.render(head, options) + (final.content or "")


def _trim_to_fit(
    loaded: LoadedModel,
    messages: Sequence[ChatMessage],
    options: RenderOptions,
    request: ChatRequest,
    prompt_len: int,
) -> tuple[Sequence[ChatMessage], MediaPrompt | None]:
    """context_overflow: trim — drop the oldest non-system messages until the request fits.

    Returns the kept messages and their prompt, or (messages, None) when
    nothing had to go. The last message is never dropped (nor the one before a continued
    final message).
    """
    wanted = request.max_tokens or 1
    limit = loaded.model.info.n_ctx_per_seq
    if prompt_len + wanted <= limit:
        return messages, None
    head = 1 if messages[0].role in ("system", "developer") else 0
    # A continued message keeps the message it answers.
    last = 2 if request.continue_final_message else 1
    droppable = len(messages) - head - last
    if droppable < 1:
        return list(messages), None
    tried: dict[int, tuple[list[ChatMessage], MediaPrompt]] = {}

    def without(count: int) -> tuple[list[ChatMessage], MediaPrompt]:
        if count not in tried:
            kept = [*messages[:head], *messages[head + count :]]
            text = render_prompt(loaded, kept, options, request)
            tried[count] = kept, loaded.prompt(text, media_of(kept))
        return tried[count]

    # The fewest oldest messages to drop, by bisection: each try renders and tokenizes the
    # whole prompt, and one at a time over thousands of messages would take hours.
    low, high = 1, droppable
    while low < high:
        middle = (low + high) // 2
        if len(without(middle)[1].tokens) + wanted <= limit:
            high = middle
        else:
            low = middle + 1
    return without(low)


def _system_tokens(
    loaded: LoadedModel,
    messages: Sequence[ChatMessage],
    options: RenderOptions,
    prompt: Sequence[int],
) -> int:
    """How many leading prompt tokens belong to the system prompt.

    Templates place the system text differently (Gemma folds it into the
    first user turn), so render the system message before two different
    probe turns: the tokens they share, and share with the prompt, are it.
    """
    if messages[0].role not in ("system", "developer"):
        return 0
    probe = RenderOptions(add_generation_prompt=False, template_kwargs=options.template_kwargs)
    first, second = (
        loaded.prompt(
            loaded.template.render([messages[0], ChatMessage(role="user", content=text)], probe),
            messages[0].media,
        ).tokens
        for text in ("A", "Z")
    )
    return min(_shared_prefix(first, second), _shared_prefix(first, prompt))


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return index
    return size


def _with_logit_bias(
    loaded: LoadedModel, sampling: SamplingParams, biases: tuple[tuple[int, float], ...]
) -> SamplingParams:
    """The request's logit biases, whose token ids must be in the model's vocabulary."""
    check_vocabulary(loaded, [token for token, _ in biases], "logit_bias")
    return replace(sampling, logit_bias=biases) if biases else sampling


def check_vocabulary(loaded: LoadedModel, tokens: Sequence[int], param: str) -> None:
    n_vocab = loaded.model.info.n_vocab
    outside = next((token for token in tokens if not 0 <= token < n_vocab), None)
    if outside is not None:
        raise InvalidRequestError(
            f"{param}: token id {outside} is not in the vocabulary of {loaded.id} "
            f"(0 to {n_vocab - 1})",
            param=param,
        )


def _shift_keep(
    loaded: LoadedModel, n_keep: int, prompt: Sequence[int], media: Sequence[MediaSpan]
) -> int | None:
    """With the model's `context_shift`, the prompt tokens a shift keeps: the request's
    `n_keep` after the model's BOS (-1: the whole prompt), as llama-server counts them.
    None without it, and for a prompt with media, which a shift could cut through."""
    if not loaded.config.context_shift or media:
        return None
    bos = loaded.model.tokenize("", add_special=True, parse_special=False)
    lead = len(bos) if list(prompt[: len(bos)]) == bos else 0
    return len(prompt) if n_keep < 0 else min(len(prompt), lead + n_keep)


def _max_tokens(
    loaded: LoadedModel, explicit: int | None, prompt_len: int, param: str, keep: int | None
) -> int:
    """How many tokens may be generated: max_tokens (or the model's default), capped by what
    is left of the context window, so a generation that reaches the window's end finishes
    with `length`, unless the window shifts (`keep`). Only a prompt that leaves no room at
    all is refused."""
    limit = loaded.model.info.n_ctx_per_seq
    room = limit - prompt_len
    if room < 1:
        raise ContextOverflowError(
            f"this request needs {prompt_len + 1} tokens ({prompt_len} in the prompt "
            f"+ 1 to generate) but the context window of {loaded.id} is {limit} tokens",
            param=param,
            prompt_tokens=prompt_len,
            context_window=limit,
        )
    wanted = explicit if explicit is not None else loaded.config.sampling.max_tokens
    wanted = wanted or DEFAULT_MAX_TOKENS
    return wanted if keep is not None else min(wanted, room)
