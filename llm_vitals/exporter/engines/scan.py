"""The targeted scanner: finds the few sample lines an adapter needs in a text-format page.

Why not prometheus-client's parser: it builds every family on a ~50-80 KB page (hundreds of
histogram buckets) on every poll of every target; this finds the dozen lines wanted in one regex
pass. It reads what the text exposition format 0.0.4 allows, as prometheus-client's parser does:

    # HELP / # TYPE / other comments       skipped (a sample line never starts with `#`)
      name{a="x",b="y \\" } \\\\"} 7 1700000000000     leading blanks, `}` and escapes inside values, a timestamp
    name {a="x"}\t7                         a blank before `{`, tabs
    name{a="x"} 7 # {trace_id="t"} 1.0     an exemplar: the value is 7, never 1.0
    name 1e3\r                              exponents, CRLF line ends, +Inf, -Inf, NaN

Values are returned as read (NaN and ±Inf included): whether a non-finite value is acceptable is
the adapter's call (a required counter: no; an optional gauge: read as absent). The property
test tests/test_scan_differential.py holds it to prometheus-client's values on generated pages.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from llm_vitals.exporter.engines import Page, PageError, PageReading

_NAME_CHARS = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# A label set, from `{` to the first `}` outside a quoted value; inside quotes `\` escapes one char.
# Runs of plain characters are taken whole and never given back (possessive `++`, `*+`): each
# character can start only one kind of token, so there is one way to read a label set, and the
# regex engine need not step through it a character at a time (a quarter of a vLLM page's scan).
_LABEL_SET = r'\{(?:[^"}\n]++|"(?:[^"\\\n]++|\\.)*+")*+\}'
_LABEL_SET_ONLY = re.compile(_LABEL_SET)
# What follows a sample line's name and blanks, read exactly: an optional label set, then the rest.
_EXACT = re.compile(rf"({_LABEL_SET})?([^\n]*)")
_LABEL_PAIR = re.compile(r'\s*,?\s*([a-zA-Z_][a-zA-Z0-9_]*|"(?:[^"\\]|\\.)*")\s*=\s*"((?:[^"\\]|\\.)*)"\s*')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_new_sample = tuple.__new__  # a Sample without NamedTuple's __new__ in Python (a sixth of a sample's cost)


class Sample(NamedTuple):
    """One sample line: its label set as written (braces included, or '') and its value."""

    label_text: str
    value: float

    def labels(self) -> Mapping[str, str]:
        """The label set, escapes undone (read-only: it is shared); PageError("bad_metrics") when it is malformed."""
        return _labels_of(self.label_text)


class Tally(NamedTuple):
    """What an adapter reads of a page in one call into this module (`Scanner.read`, `Scanner.tally`)."""

    found: dict[str, list[Sample]]  # the wanted samples by name, in page order
    sums: list[float | None]  # each of the scanner's `sums`' `total`, in order
    picked: list[Sample]  # the scanner's `pick` family's samples whose label has the value (`labelled`)
    # Their `finite_sum` (0 for none), or the error it gives, which the adapter raises in its own turn.
    picked_sum: float | PageError


class Scanner:
    """A compiled scan for a fixed set of full sample names (`..._total`, `..._count` as written).

    An adapter that names them also gets, in the same call (`read`, `tally`), the families its page
    must have (`required`, named in the error as a `kind` page), its page-wide sums (`sums`) and the
    samples of one family picked by a label's value (`pick`: family, label, value), with their sum.
    """

    def __init__(self, names: Iterable[str], *, required: tuple[str, ...] = (), kind: str = "",
                 sums: tuple[str, ...] = (), pick: tuple[str, str, str] | None = None) -> None:
        self.required, self.kind, self.sums, self.pick = required, kind, sums, pick
        self.names = tuple(dict.fromkeys(names))
        for name in self.names:
            if not _NAME_CHARS.fullmatch(name):
                raise ValueError(f"not a metric name: {name!r}")
        # Each wanted name read as written, whatever blanks led its line (the key `scan` files it under).
        self._names = {name: name for name in self.names}
        branches = _trie_branches(self.names)
        names = "|".join(branches)
        # A sample line: line start, any blanks, the name, then a label set and the rest of the
        # line (value, timestamp, exemplar). After the name any blanks but a newline may stand
        # (prometheus-client strips them, a lone CR included), as long as a space, a tab or the
        # label set's `{` is among or after them. The label set is taken quickly, up to the first
        # `}` wherever it is: `scan` checks it.
        # Blanks before the name are one more branch beside the names' first characters, not a
        # `\s*` before them: each branch starts with one character the regex engine checks in
        # place, so the ~600 lines a page has beside the wanted ones cost a tenth less.
        self._findall = re.compile(
            rf"\n((?:{names}|[^\S\n]\s*+(?:{names})))(?=[^\S\n]*[ \t{{])[^\S\n]*(\{{[^}}]*\}})?([^\n]*)").findall

    def scan(self, text: str) -> dict[str, list[Sample]]:
        """The wanted samples by name, in page order; PageError("bad_metrics") for a line that is not a sample.

        Each line reads as one regex of the whole line (`\\n\\s*(name)`, the blanks, `_LABEL_SET`, the
        rest) and `_value` would read it, values and errors alike (tests/test_scan_differential.py
        holds it to that), without their cost on the common line, a quarter of a vLLM page's
        parse: a label set known well-formed, then a lone number.
        """
        found: dict[str, list[Sample]] = {}
        names = self._names
        for line_name, label_text, rest in self._findall("\n" + text):
            name = names.get(line_name) or names[line_name.lstrip()]
            if label_text and ("\n" in label_text or not _is_label_set(label_text)):
                # Not one well-formed label set up to its first `}`: read the line exactly (a `}`
                # within a value, or a label set left open, whose quick take ran past the line).
                sample = _exact_sample(name, (label_text + rest).partition("\n")[0])
            elif "_" not in rest:
                # float() of a lone number with blanks around it is `_value`'s number: it refuses
                # a second token, a `#` or a brace; only `_` (1_000) it takes where the format does not.
                try:
                    sample = _new_sample(Sample, (label_text, float(rest)))
                except ValueError:
                    sample = _new_sample(Sample, (label_text, _value(name, label_text, rest)))
            else:
                sample = _new_sample(Sample, (label_text, _value(name, label_text, rest)))
            samples = found.get(name)
            if samples is None:
                samples = found[name] = []
            samples.append(sample)
        return found


    def read(self, body: bytes) -> Tally:
        """`tally` of the `scan` of a page's body, decoded first (strict UTF-8: `decode`): an adapter's one call per page."""
        return self.tally(self.scan(decode(body)))

    def tally(self, found: dict[str, list[Sample]]) -> Tally:
        """The `required` families checked, the `pick` made and the `sums` taken, in that order, so that a
        page broken twice reads the first error as before; the picked samples' sum, or its error, is
        returned for the adapter to raise after its own checks (vLLM: after its sleep state's labels)."""
        for name in self.required:
            if name not in found:
                raise PageError("bad_metrics", f"no {name} on the page (not a {self.kind} /metrics page?)")
        picked: list[Sample] = []
        if self.pick is not None:
            samples = found.get(self.pick[0])
            picked = labelled(samples, self.pick[1], self.pick[2]) if samples else []
        sums = totals(found, self.sums)
        picked_sum: float | PageError = 0.0
        if picked:
            try:
                picked_sum = finite_sum(self.pick[0] if self.pick else "", picked)
            except PageError as exc:
                picked_sum = exc
        return Tally(found, sums, picked, picked_sum)


def _trie_branches(names: Iterable[str]) -> list[str]:
    """Regexes matching exactly `names`, factored by common prefix: one per first character.

    Factored, the regex engine rejects each of the page's ~600 other lines after a character or
    a few, instead of trying every name in turn (2.5x faster on a vLLM page).
    """
    tree: dict[str, dict] = {}
    for name in names:
        node = tree
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: dict[str, dict]) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
        optional = "" in node
        if not branches:
            return ""
        # Chains of single characters stay literal; only real branch points get a group.
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if optional:
            return f"(?:{body})?" if len(branches) == 1 else body[:-1] + "|)"
        return body

    return [re.escape(char) + pattern(child) for char, child in sorted(tree.items())]


def _trie(names: Iterable[str]) -> str:
    """One regex matching exactly `names` (see _trie_branches)."""
    return "(?:" + "|".join(_trie_branches(names)) + ")"


def _exact_sample(name: str, rest: str) -> Sample:
    """The sample of a line from what follows its name and blanks, read by `_EXACT`."""
    match = _EXACT.match(rest)
    assert match is not None  # (both groups may be empty)
    label_text = match.group(1) or ""
    return _new_sample(Sample, (label_text, _value(name, label_text, match.group(2))))


# A fleet's pages repeat the same few label sets at every poll: each is checked once per process.
# One that is well-formed and ends at its first `}` is what `_LABEL_SET` reads from that `{`: with
# no `}` before its end, no `}` within quotes could have ended it elsewhere.
@functools.lru_cache(maxsize=4096)
def _is_label_set(label_text: str) -> bool:
    return _LABEL_SET_ONLY.fullmatch(label_text) is not None


def _value(name: str, label_text: str, rest: str) -> float:
    # An exemplar (` # {trace_id="..."} 1.0`) follows the value and timestamp: never read it.
    head = rest.split(" # ", 1)[0]
    fields = head.split(None, 1)
    if not fields:
        raise PageError("bad_metrics", f"sample {name} has no value")
    token = fields[0]
    if token.startswith("{") or "{" in head or "}" in head:
        # A second label set, or one not closed: prometheus-client would read some of these as a
        # sample of another name; reading a number from them could only be a wrong number.
        raise PageError("bad_metrics", f"unterminated or malformed label set in {name}: {token[:40]!r}")
    # float() alone would take `1_000`, which the format (and prometheus-client) refuse.
    if "_" in token:
        raise PageError("bad_metrics", f"sample {name} has a non-numeric value {token[:40]!r}")
    try:
        return float(token)
    except ValueError:
        raise PageError("bad_metrics", f"sample {name} has a non-numeric value {token[:40]!r}") from None


def parse_labels(label_text: str) -> dict[str, str]:
    """`{a="x",b="y"}` -> {"a": "x", "b": "y"}, escapes undone; PageError("bad_metrics") when malformed."""
    if not label_text:
        return {}
    inner = label_text[1:-1]
    labels: dict[str, str] = {}
    position = 0
    while match := _LABEL_PAIR.match(inner, position):
        key, value = match.group(1), match.group(2)
        labels[_unescape(key[1:-1]) if key.startswith('"') else key] = _unescape(value)
        position = match.end()
        if position < len(inner) and inner[position] != ",":
            raise PageError("bad_metrics", f"malformed label set {label_text[:80]!r}")
    # What is left may only be one trailing comma and blanks.
    rest = inner[position:]
    if rest.strip(" \t,") or rest.count(",") > 1:
        raise PageError("bad_metrics", f"malformed label set {label_text[:80]!r}")
    return labels


# A fleet's pages repeat the same few label sets (engine, model, sleep state) at every poll: each is
# parsed once, not once per poll (a fifth of a vLLM page's parse went to its three sleep_state lines).
# A malformed one raises each time: exceptions are not cached.
@functools.lru_cache(maxsize=4096)
def _labels_of(label_text: str) -> Mapping[str, str]:
    return MappingProxyType(parse_labels(label_text))


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value) if "\\" in value else value


def finite_sum(name: str, samples: Iterable[Sample]) -> float:
    """The sum of `name`'s samples (0 for none); PageError("bad_metrics") if one is NaN or ±Inf.

    The rule for every signal the verdict relies on: a sum that takes one NaN is NaN, and a
    counter read as NaN would look like progress, or like none, at random.
    """
    summed = 0.0
    for sample in samples:
        if not math.isfinite(sample.value):
            raise PageError("bad_metrics", f"sample {name} is {show(sample.value)}")
        summed += sample.value
    return summed


def by_label(samples: Iterable[Sample], label: str) -> dict[str, float]:
    """The finite values of `samples` summed per value of `label` ('' where a sample lacks it).

    For an engine's units (llm_vitals/exporter/engines/__init__.py's `Unit`): a NaN or ±Inf sample is
    left out of its unit's sum, as `finite` does for optional signals; the page-wide sums keep the
    stricter `finite_sum` rule.
    """
    summed: dict[str, float] = {}
    for sample in samples:
        if math.isfinite(sample.value):
            key = sample.labels().get(label, "")
            summed[key] = summed.get(key, 0.0) + sample.value
    return summed


def total(found: dict[str, list[Sample]], name: str) -> float | None:
    """The finite sum of `name`'s samples (`finite_sum`), None when the page has none."""
    samples = found.get(name)
    return finite_sum(name, samples) if samples else None


def totals(found: dict[str, list[Sample]], names: Iterable[str]) -> list[float | None]:
    """Each of `names`' `total`, in order (the first sum that is not finite raises): an adapter's sums in one call."""
    sums: list[float | None] = []
    for name in names:
        samples = found.get(name)
        sums.append(finite_sum(name, samples) if samples else None)
    return sums


def labelled(samples: Iterable[Sample], label: str, value: str) -> list[Sample]:
    """The samples whose `label` is `value`; PageError("bad_metrics") for a malformed label set."""
    return [sample for sample in samples if sample.labels().get(label) == value]


def snapshot_of(found: dict[str, list[Sample]], *, running: str, waiting: str, steps: str | None = None,
                generation_tokens: str | None = None, prompt_tokens: str | None = None, finished: str | None = None,
                **more: Any) -> PageReading:
    """The PageReading of an engine that names one family for each of these fields: each the family's
    `total` (None where the page has none; running and waiting read 0 then), and `more` as given."""

    def of(name: str | None) -> float | None:
        return total(found, name) if name else None

    return PageReading(running=total(found, running) or 0.0, waiting=total(found, waiting) or 0.0, steps=of(steps),
                       generation_tokens=of(generation_tokens), prompt_tokens=of(prompt_tokens), finished=of(finished),
                       **more)


def decode(body: bytes) -> str:
    """A page's text (strict UTF-8, as the format requires); PageError("bad_metrics") otherwise."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PageError("bad_metrics", f"page is not UTF-8 (byte {exc.start})") from None



def text_parse(parse_text: Callable[[str], PageReading]) -> Callable[[Page], PageReading]:
    """An engine's `parse` from a parser of the page's text: the body decoded (strict UTF-8) first; raises PageError."""

    def parse(page: Page) -> PageReading:
        return parse_text(decode(page.body))

    return parse

def show(value: float) -> str:
    """A value as the format writes it (NaN, +Inf, -Inf), for error details."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def finite(value: float | None) -> float | None:
    """The value, or None when it is NaN or ±Inf: for optional signals, which must not reject a page."""
    return value if value is not None and math.isfinite(value) else None
