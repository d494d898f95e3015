"""What a GBNF grammar would do to llama.cpp, read before llama.cpp builds it.

llama.cpp's grammar code trusts its input. Its parser recurses once per level
of parentheses and its left-recursion check once per rule in a chain of rules
that each start with the next: tens of thousands of levels overflow the stack
and kill the process. And the grammar keeps one stack per way the next
character can be matched: a few hundred bytes of rules that each use the one
before twice (`r2 ::= r1 r1`, with `r1` optional) make millions of them,
which building the grammar never finishes. Each sampled token is checked
against every stack, so their number is also what a grammar costs per token.

This module parses GBNF as llama.cpp's parser does (src/llama-grammar.cpp)
into a small tree and measures three things: the size, the depth of both
recursions, and `branches`, the most stacks any position can open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A rule is a list of alternative sequences of items.
Alternatives = list[list["Item"]]


@dataclass(frozen=True)
class Item:
    """One element of a sequence: a terminal (`ref` None) or a rule, repeated `least` to
    `most` times (`most` None: no bound). Parenthesised groups and repetitions become
    rules of their own, as llama.cpp's parser makes them."""

    ref: str | None = None
    least: int = 1
    most: int | None = 1


@dataclass(frozen=True)
class GrammarShape:
    size: int  # bytes of GBNF
    depth: int  # deepest parentheses, or longest chain of rules each starting with the next
    branches: int  # most stacks one position opens (saturates a little past the limit asked)


class GbnfSyntaxError(ValueError):
    pass


class GrammarTooDeepError(ValueError):
    pass


_ESCAPE_WIDTHS = {"x": 2, "u": 4, "U": 8}


@dataclass
class _Parser:
    """llama.cpp's GBNF parser without recursion: open groups are a stack of frames."""

    text: str
    max_depth: int
    pos: int = 0
    deepest: int = 0
    rules: dict[str, Alternatives] = field(default_factory=dict)

    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < len(self.text) else ""

    def fail(self, what: str) -> GbnfSyntaxError:
        return GbnfSyntaxError(f"{what} at character {self.pos}")

    def space(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            elif char == "#":
                while self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                    self.pos += 1
            else:
                return

    def name(self) -> str:
        start = self.pos
        while _word_char(self.peek()):
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a name")
        return self.text[start : self.pos]

    def skip_char(self) -> None:
        if self.peek() == "\\":
            escape = self.peek(1)
            if escape in _ESCAPE_WIDTHS:
                self.pos += 2 + _ESCAPE_WIDTHS[escape]
            elif escape and escape in 'trn\\"[]-':
                self.pos += 2
            else:
                raise self.fail("unknown escape")
        elif self.peek():
            self.pos += 1
        else:
            raise self.fail("unexpected end of input")

    def parse(self) -> dict[str, Alternatives]:
        self.space(True)
        while self.pos < len(self.text):
            name = self.name()
            self.space(False)
            if self.text[self.pos : self.pos + 3] != "::=":
                raise self.fail("expecting ::=")
            self.pos += 3
            self.space(True)
            self.rules[name] = self.body(name)
            if self.peek() and self.peek() not in "\r\n":
                raise self.fail("expecting newline or end")
            self.space(True)
        return self.rules

    def body(self, name: str) -> Alternatives:
        """A rule's alternatives; each group met on the way becomes a rule of its own."""
        frames: list[tuple[Alternatives, list[Item]]] = [([], [])]
        while True:
            alternatives, items = frames[-1]
            nested = len(frames) > 1
            char = self.peek()
            if char and char in '"[':
                close = '"' if char == '"' else "]"
                self.pos += 1
                if char == "[" and self.peek() == "^":
                    self.pos += 1
                start = self.pos
                while self.peek() != close:
                    self.skip_char()
                if self.pos > start:  # `""` and `[]` add nothing to the rule
                    items.append(Item())
                self.pos += 1
            elif char and char in "<!":
                end = self.text.find(">", self.pos)
                if end < 0:
                    raise self.fail("expecting '>'")
                self.pos = end + 1
                items.append(Item())
            elif _word_char(char):
                items.append(Item(ref=self.name()))
            elif char == ".":
                self.pos += 1
                items.append(Item())
            elif char == "(":
                if len(frames) > self.max_depth:
                    raise GrammarTooDeepError(f"parentheses nested deeper than {self.max_depth}")
                self.pos += 1
                frames.append(([], []))
                self.deepest = max(self.deepest, len(frames) - 1)
                self.space(True)
                continue
            elif char == ")" and nested:
                self.pos += 1
                alternatives.append(items)
                frames.pop()
                frames[-1][1].append(Item(ref=self.rule(name, alternatives)))
                nested = len(frames) > 1
            elif char and char in "*+?{":
                if not items:
                    raise self.fail("expecting an item before */+/?/{")
                items[-1] = self.repeated(name, items[-1], nested)
                continue
            elif char == "|":
                self.pos += 1
                alternatives.append(items)
                frames[-1] = (alternatives, [])
                self.space(True)
                continue
            elif nested:
                raise self.fail("expecting ')'")
            else:
                alternatives.append(items)
                return alternatives
            self.space(nested)

    def rule(self, name: str, alternatives: Alternatives) -> str:
        generated = f"{name}({len(self.rules)}"  # "(": no GBNF name holds one
        self.rules[generated] = alternatives
        return generated

    def repeated(self, name: str, item: Item, nested: bool) -> Item:
        char = self.peek()
        self.pos += 1
        self.space(nested)
        least: int
        most: int | None
        if char != "{":
            least, most = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        else:
            least = most = self.integer()
            self.space(nested)
            if self.peek() == ",":
                self.pos += 1
                self.space(nested)
                most = self.integer() if self.peek().isdigit() else None
                self.space(nested)
            if self.peek() != "}":
                raise self.fail("expecting '}'")
            self.pos += 1
            self.space(nested)
        # llama.cpp rewrites a repetition into rules of its own: one more level of rules.
        return Item(ref=self.rule(name, [[item]]), least=least, most=most)

    def integer(self) -> int:
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting an int")
        return int(self.text[start : self.pos])


def _word_char(char: str) -> bool:
    return bool(char) and char.isascii() and (char.isalnum() or char == "-")


def measure(gbnf: str, root: str, max_depth: int, cap: int) -> GrammarShape:
    """The grammar's size, depth and branches (counted up to `cap`, then saturated).

    Raises GbnfSyntaxError where llama.cpp's parser would refuse the text too, and
    GrammarTooDeepError past `max_depth` levels of parentheses (before going deeper).
    """
    parser = _Parser(gbnf, max_depth)
    rules = parser.parse()
    if root not in rules:
        raise GbnfSyntaxError(f"the grammar has no rule {root!r}")
    for alternatives in rules.values():
        for sequence in alternatives:
            for item in sequence:
                if item.ref is not None and item.ref not in rules:
                    raise GbnfSyntaxError(f"rule {item.ref!r} is used but not defined")
    analysis = _Analysis(rules, cap)
    return GrammarShape(
        size=len(gbnf.encode("utf-8", "surrogatepass")),
        depth=max(parser.deepest, analysis.longest_chain()),
        branches=analysis.most_branches(),
    )


class _Analysis:
    """Nullability, branches and chains of first references, over rules only (groups are
    rules here), each computed iteratively: the grammar being measured may be exactly
    one deep enough to exhaust a recursive walk."""

    def __init__(self, rules: dict[str, Alternatives], cap: int) -> None:
        self.rules = rules
        self.cap = cap
        self.nullable_rules = self._nullable_rules()
        self.firsts = {name: self._first_refs(rules[name]) for name in rules}
        self.branches = self._rule_branches()

    def _nullable_rules(self) -> set[str]:
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.rules.items():
                if name in nullable:
                    continue
                if any(all(self._nullable(item, nullable) for item in seq) for seq in alternatives):
                    nullable.add(name)
                    changed = True
        return nullable

    @staticmethod
    def _nullable(item: Item, nullable: set[str]) -> bool:
        return item.least == 0 or (item.ref is not None and item.ref in nullable)

    def nullable(self, item: Item) -> bool:
        return self._nullable(item, self.nullable_rules)

    def _first_refs(self, alternatives: Alternatives) -> list[str]:
        """Rules referenced where one of the alternatives can start."""
        found: list[str] = []
        for sequence in alternatives:
            for item in sequence:
                if item.ref is not None:
                    found.append(item.ref)
                if not self.nullable(item):
                    break
        return found

    def _post_order(self) -> list[str]:
        """Every rule after the rules it starts with (cycles, i.e. left recursion, cut)."""
        order: list[str] = []
        done: set[str] = set()
        for start in self.rules:
            if start in done:
                continue
            done.add(start)
            stack = [(start, iter(self.firsts[start]))]
            while stack:
                current, refs = stack[-1]
                ref = next(refs, None)
                if ref is None:
                    stack.pop()
                    order.append(current)
                elif ref not in done:
                    done.add(ref)
                    stack.append((ref, iter(self.firsts[ref])))
        return order

    def _rule_branches(self) -> dict[str, int]:
        branches: dict[str, int] = {}
        for name in self._post_order():
            total = 0
            for sequence in self.rules[name]:
                for item in sequence:
                    total = min(self.cap, total + self._item_branches(item, branches))
                    if not self.nullable(item):
                        break
            branches[name] = max(total, 1)
        return branches

    def _item_branches(self, item: Item, branches: dict[str, int]) -> int:
        if item.ref is None:
            return 1
        inner = branches.get(item.ref, 1)  # 1: a left-recursive reference, refused anyway
        if item.ref not in self.nullable_rules:
            return inner
        # llama.cpp unrolls `x{m,n}` into copies; each copy of a nullable x opens x's stacks.
        copies = item.most if item.most is not None else item.least + 1
        return min(self.cap, inner * max(copies, 1))

    def most_branches(self) -> int:
        """The most stacks any position of any sequence opens."""
        most = 0
        for alternatives in self.rules.values():
            for sequence in alternatives:
                suffix = 0
                for item in reversed(sequence):
                    here = self._item_branches(item, self.branches)
                    suffix = min(self.cap, here + (suffix if self.nullable(item) else 0))
                    most = max(most, suffix)
        return max(most, max(self.branches.values(), default=0))

    def longest_chain(self) -> int:
        """llama.cpp's left-recursion check recurses along first references: the longest
        chain of them is how deep it goes."""
        longest: dict[str, int] = {}
        for name in self._post_order():
            longest[name] = 1 + max((longest.get(ref, 0) for ref in self.firsts[name]), default=0)
        return max(longest.values(), default=0)
