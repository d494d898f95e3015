"""Fill-in-the-middle prompts (llama-server's /infill, a completion's `suffix`): the code
before and after the cursor in the model's FIM tokens, laid out as llama-server lays them
(tools/server's format_infill), so an editor plugin written for it gets the same prompt:

    [BOS] [<repo>myproject\n <sep>file\ntext ... <sep>filename\n]
    <pre>prefix typed <suf>suffix <mid>

Within the room the window leaves after the answer: the suffix keeps at most a quarter of
it (its start), the prefix the rest (its end), the other files what the two leave (their
end: the files nearest the one edited)."""

from __future__ import annotations

from kronk_core.contract.backend import FimTokens, TextModel
from kronk_core.contract.errors import InvalidRequestError
from kronk_core.contract.types import Infill

# llama-server's names for what the layout leaves unnamed: the project, the file edited.
PROJECT = "myproject"
CURRENT_FILE = "filename"
# Where a model has no file separator, files are told apart by this line (llama-server's).
SNIPPET = "\n\n--- snippet ---\n\n"


def infill_tokens(
    model: TextModel, fim: FimTokens | None, prefix: str, infill: Infill, room: int
) -> list[int]:
    """The prompt's tokens; `room` is how many the prompt may take."""
    if fim is None:
        raise InvalidRequestError(
            "suffix: this model has no fill-in-the-middle tokens; use a code model that has "
            "(Qwen2.5-Coder, CodeGemma, StarCoder2, Codestral...)",
            param="suffix",
        )

    def tokens(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    start = model.tokenize("", add_special=True, parse_special=False)  # BOS, where it has one
    before, after, typed = tokens(prefix), tokens(infill.suffix), tokens(infill.typed)
    files: list[int] = []
    if fim.repo is not None:
        files += [fim.repo, *tokens(PROJECT + "\n")]
    for file in infill.files:
        if fim.separator is not None:
            files += [fim.separator, *tokens(file.filename + "\n")]
        else:
            files += tokens(SNIPPET)
        files += tokens(file.text)
    if fim.separator is not None:
        files += [fim.separator, *tokens(CURRENT_FILE + "\n")]
    code = max(0, room - len(start) - 3 - len(typed))  # 3: the prefix, suffix, middle tokens
    after = after[: min(len(after), code // 4)]
    before = before[len(before) - min(len(before), code - len(after)) :]
    left = code - len(after) - len(before)
    files = files[len(files) - min(len(files), left) :]
    return [*start, *files, fim.prefix, *before, *typed, fim.suffix, *after, fim.middle]
