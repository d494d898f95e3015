"""IMC's debug lines (docs/caching.md, "Debug lines"): a line per slot compared and one
per plan, their numbers the ones the response's usage reports."""

from __future__ import annotations

import logging
import re

import pytest

from kronk_testing.plugin import ScriptedKronk

SYSTEM = "You are the ship's computer. Answer briefly and precisely. " * 4
PLAN = re.compile(r"slot\[(\d+)\] plan: (.+), keeps (\d+)/(\d+) tokens \((\d+)% salvageable\)")
COMPARED = re.compile(r"slot\[(\d+)\] common-prefix (\d+)/(\d+) tokens \((\d+)% salvageable\)")


async def test_each_request_logs_its_comparisons_and_its_plan(
    scripted_kronk: ScriptedKronk, caplog: pytest.LogCaptureFixture
) -> None:
    kronk = scripted_kronk({"m": {"n_seq_max": 2, "caching": {"host_cache_bytes": 0}}})
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Heading?"}]
    other = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi."}]
    plans: list[tuple[str, int, int]] = []
    compared: list[list[tuple[int, int, int]]] = []
    results = []
    for messages in (first, other, first, "continued"):
        if messages == "continued":  # the first conversation goes on
            answer = {"role": "assistant", "content": results[2].content}
            messages = [*first, answer, {"role": "user", "content": "Speed?"}]
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="kronk_caching.imc"):
            result = await kronk.chat(messages, model="m", max_tokens=4)
        results.append(result)
        lines = [record.getMessage() for record in caplog.records]
        (plan,) = [found for line in lines if (found := PLAN.fullmatch(line))]
        kept, prompt = int(plan[3]), int(plan[4])
        # The plan's numbers are what the answer says it reused, of its prompt.
        assert (kept, prompt) == (result.usage.cached_tokens, result.usage.prompt_tokens)
        assert int(plan[5]) == 100 * kept // prompt
        plans.append((plan[2], kept, prompt))
        found = [COMPARED.fullmatch(line) for line in lines]
        compared.append([(int(m[1]), int(m[2]), int(m[3])) for m in found if m])
    # Nothing to compare at first; then the first conversation's slot, which shares nothing
    # usable with the other; then both slots.
    assert compared[0] == []
    assert compared[1] == [(0, 0, plans[1][2])]
    assert sorted(slot for slot, _, _ in compared[2]) == [0, 1]
    # The repeat cuts the first answer off its slot (which held it but its last token,
    # sampled and never decoded); the next turn extends it.
    first_held = results[0].usage.prompt_tokens + results[0].usage.completion_tokens - 1
    assert [what for what, _, _ in plans] == [
        "rebuilt", "rebuilt", f"cut back from {first_held}", "extended"
    ]  # fmt: skip
    for (_, kept, prompt), slots in zip(plans[2:], compared[2:], strict=True):
        assert 0 < kept < prompt
        assert (0, kept, prompt) in slots  # what slot 0 was compared to keep, it kept
