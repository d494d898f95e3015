"""Checks of what a model answered, for tests that can only judge its text."""

from __future__ import annotations

import re

# What an answer about the sea mentions (a base model continues the prompt's text instead).
SEA_WORDS = ("sea", "ocean", "wave", "water", "tide", "shore", "surf", "beach", "coast", "sail")
ENGLISH_WORDS = {"the", "a", "of", "and", "in", "is", "to", "with", "its", "on", "where", "that"}


def assert_english_about_the_sea(answer: str) -> None:
    """The answer to "Write a haiku about the sea." of an instruction-tuned model: English
    words, about the sea, and not a continuation of the prompt."""
    words = [word.lower() for word in re.findall(r"[A-Za-z']+", answer)]
    assert len(words) >= 5, answer
    letters = [char for char in answer if char.isalpha()]
    assert sum(char.isascii() for char in letters) >= 0.95 * len(letters), answer
    assert len(ENGLISH_WORDS.intersection(words)) >= 2, answer
    assert any(word.startswith(SEA_WORDS) for word in words), answer
    assert not answer.lower().startswith("write a haiku"), answer  # not a continuation
