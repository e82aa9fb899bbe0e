"""The targeted scanner against prometheus-client's parser, on generated pages and mutated real pages.

The property: wherever prometheus-client parses a page, every sample the scanner reads has the
client's value and labels, in the same order; wherever either refuses a page, the scanner and every
adapter give a PageError or those same values, never another exception and never another number.
On the generated pages, which use only what the text format allows, the scanner never refuses.
"""

from __future__ import annotations

import importlib
import math
import random
import re
from pathlib import Path

import pytest
from conftest import FIXTURES
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from property import property_settings, record_examples

from llm_vitals.exporter.engines import Page, PageError, PageReading
from llm_vitals.exporter.engines.scan import _LABEL_SET, Sample, Scanner, _trie
from llm_vitals.exporter.engines.scan import _value as value_of_line
from llm_vitals.exporter.engines.table import ENGINES

GENERATED_EXAMPLES = 7_000
MUTATED_EXAMPLES = 3_000
EXACT_EXAMPLES = 3_000

# Every Scanner an adapter module holds (whatever its name) is held to the client.
SCANNERS: dict[str, Scanner] = {}
for _name in ENGINES:
    for _value in vars(importlib.import_module(f"llm_vitals.exporter.engines.{_name}")).values():
        if isinstance(_value, Scanner):
            SCANNERS[f"{_name}:{id(_value)}"] = _value
WANTED = sorted({name for scanner in SCANNERS.values() for name in scanner.names})
ALL = Scanner(WANTED)
# Names a scanner must not mistake for its own: longer names sharing a prefix, shorter ones, others.
DISTRACTORS = sorted({f"{n}_by_reason" for n in WANTED[:6]} | {f"{n}x" for n in WANTED[:6]}
                     | {n[:-1] for n in WANTED[:6]} | {"http_requests_total", "up", "process_cpu_seconds_total"})
HISTOGRAMS = sorted({n[: -len("_count")] for n in WANTED if n.endswith("_count")})

RUNS = {'generated': 0, 'mutated': 0, 'exact': 0}  # examples run, per property
REAL_PAGES = sorted(p for p in FIXTURES.glob("*/*metrics*.txt")
                    if p.stat().st_size > 0 and not p.name.endswith(".headers.txt"))


# -- the reference: prometheus-client's reading of the same page --------------------------------------
def client_samples(text: str, names: tuple[str, ...]) -> dict[str, list[Sample]] | None:
    """The client's samples of `names` by name, in page order; None when the client refuses the page."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:
        return None
    # The client renames the samples of a family declared `counter` whose name lacks `_total`.
    renamed = {n for n in declared_counters(text) if n in names and not n.endswith("_total")}
    found: dict[str, list[Sample]] = {}
    for family in families:
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and family.name in renamed and name == family.name + "_total":
                name = family.name
            if name in names:
                found.setdefault(name, []).append(Sample(repr(sorted(sample.labels.items())), float(sample.value)))
    return found


def declared_counters(text: str) -> set[str]:
    """Names a `TYPE ... counter` comment declares, read as the client reads comments (`## TYPE` too)."""
    names = set()
    for line in text.split("\n"):
        parts = line.strip().split(None, 3)
        if len(parts) == 4 and parts[0].startswith("#") and parts[1] == "TYPE" and parts[3] == "counter":
            names.add(parts[2])
    return names


def same(ours: list[Sample], theirs: list[Sample]) -> bool:
    if len(ours) != len(theirs):
        return False
    for mine, reference in zip(ours, theirs, strict=True):
        if repr(sorted(mine.labels().items())) != reference.label_text:
            return False
        if not (mine.value == reference.value or (math.isnan(mine.value) and math.isnan(reference.value))):
            return False
    return True


def check(text: str, legal: bool) -> None:
    """The property, for one page."""
    body = text.encode("utf-8")
    for name, entry in ENGINES.items():
        if entry.parse is None:
            continue
        try:
            result = entry.parse(Page(body))
        except PageError:
            continue
        assert isinstance(result, PageReading), f"{name} adapter on {text!r}"
    try:
        ours: dict[str, list[Sample]] | None = ALL.scan(text)
        for samples in ours.values():
            for sample in samples:
                sample.labels()
    except PageError as exc:
        assert not legal, f"the scanner refused a legal page ({exc.detail}): {text!r}"
        ours = None
    theirs = client_samples(text, ALL.names)
    if ours is None or theirs is None:
        return
    for name in ALL.names:
        assert same(ours.get(name, []), theirs.get(name, [])), (
            f"{name}: scanner read {ours.get(name)}, prometheus-client {theirs.get(name)}, on {text!r}")


# -- generated pages: every legal variation -----------------------------------------------------------
# Pages are built by plain Python from one drawn seed: a hypothesis draw costs ~20 us, and a page of
# ~200 draws made 10,000 examples take minutes on a loaded box. A failure prints its page.
LABEL_CHARS = ['a', 'Z', '0', ' ', '"', '\\', '\n', '}', '{', ',', '=', '#', ' # ', 'é', '\t', '\r', '💡']
LABEL_NAMES = ["engine", "model_name", "mode", "endpoint", "model", "version", "a", "_b9"]
SPECIAL_VALUES = ["+Inf", "-Inf", "Inf", "NaN", "nan", "0", "-0", "1e3", "1.5E-3", ".5", "5.", "+5", "17"]
BLANKS = [" ", "  ", "\t", " \t"]
MAYBE_BLANKS = ["", "", " ", "\t", "  "]


def value(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randint(-10**20, 10**20))
    if kind == 1:
        return repr(rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-30, 30))
    if kind == 2:
        return f"{rng.uniform(-1e3, 1e3):e}"
    if kind == 3:
        return f"{rng.uniform(0, 1e6):E}"
    return rng.choice(SPECIAL_VALUES)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def chars(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(LABEL_CHARS) for _ in range(rng.randint(0, most)))


def label_set(rng: random.Random, extra: tuple[str, ...] = ()) -> str:
    names = [n for n in rng.sample(LABEL_NAMES, rng.randint(0, 3)) if n not in extra] + list(extra)
    if not names and rng.random() < 0.5:
        return ""
    pairs = []
    for name in names:
        text = "+Inf" if name == "le" and rng.random() < 0.5 else chars(rng, 4)
        around = rng.choice(MAYBE_BLANKS)
        pairs.append(f'{around}{name}{around}={around}"{escape(text)}"{around}')
    trailing = "," if pairs and rng.random() < 0.5 else ""
    return "{" + ",".join(pairs) + trailing + "}"


def sample_line(rng: random.Random, name: str, extra: tuple[str, ...] = ()) -> str:
    labels = label_set(rng, extra)
    before_brace = rng.choice(MAYBE_BLANKS) if labels else ""
    separator = rng.choice([" ", "\t", "  ", ""]) if labels else rng.choice(BLANKS)
    line = f"{rng.choice(MAYBE_BLANKS)}{name}{before_brace}{labels}{separator}{value(rng)}"
    exemplar = rng.random() < 0.25
    if rng.random() < 0.5:
        # An exemplar's blanks are spaces; the client picks one separator for value and timestamp.
        line += (" " if exemplar else rng.choice(BLANKS)) + str(rng.randint(-10**13, 10**13))
    if exemplar:
        line += f' # {{trace_id="{escape(chars(rng, 4))}"}} {value(rng)}'
        if rng.random() < 0.5:
            line += f" {rng.randint(0, 10**10)}.{rng.randint(0, 999):03d}"
    return line


def family(rng: random.Random) -> list[str]:
    kind = rng.choice(["counter", "gauge", "untyped", "histogram", "summary", "none"])
    if kind == "histogram" and HISTOGRAMS:
        base = rng.choice(HISTOGRAMS)
    else:
        base = rng.choice(WANTED + DISTRACTORS)
        if kind == "counter" and not base.endswith("_total"):
            kind = "gauge"  # counters are named ..._total, as every exporter writes them
        if kind == "histogram":
            kind = "untyped"
    lines = []
    if rng.random() < 0.5:
        lines.append(f"# HELP {base} {chars(rng, 6).replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
    if kind != "none":
        lines.append(f"# TYPE {base} {kind}")
    for _ in range(rng.randint(0, 3)):
        if kind == "histogram":
            lines.append(sample_line(rng, base + "_bucket", ("le",)))
            lines.append(sample_line(rng, base + rng.choice(["_count", "_sum"])))
        elif kind == "summary":
            lines.append(sample_line(rng, base, ("quantile",)))
        else:
            lines.append(sample_line(rng, base))
    return lines


def page(seed: int) -> str:
    """A page of 1-5 families (plus maybe one repeated), comments and blank lines, LF or CRLF."""
    rng = random.Random(seed)
    blocks = [family(rng) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.3:
        blocks.append(blocks[0])  # a family repeated later in the page
    lines = [line for block in blocks for line in block]
    for _ in range(rng.randint(0, 2)):
        lines.insert(rng.randint(0, len(lines)), rng.choice(["", "# a comment", "#", "   "]))
    newline = rng.choice(["\n", "\r\n"])
    return newline.join(lines) + (newline if rng.random() < 0.5 else "")


# The shapes the scanner used to get wrong (issue 15): each is kept as an explicit example.
ISSUE_15_PAGES = [
    'vllm:num_requests_running{engine="0"} 7 # {trace_id="x"} 1.0\n',  # exemplar: 7, not 1.0
    'vllm:num_requests_running\t7\n',  # a tab
    '   vllm:num_requests_running{engine="0"} 7\n',  # leading spaces
    'vllm:num_requests_running {engine="0"} 7\n',  # a space before `{`
    'vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\n',
    'vllm:num_requests_running{a="}",b="\\"}"} 3 1700000000000\r\n',  # `}` in values, a timestamp, CRLF
]
# Found by the mutation property: a carriage return between a name and its label set.
FOUND_PAGES = ['nv_inference_exec_count\r{model="toy_lm",version="1"} 1\nvllm:num_requests_running\x0c{a="b"} 3\n'
               'vllm:num_requests_waiting\r 4\nvllm:kv_cache_usage_perc\r5\n']


@given(st.integers(0, 2**64).map(page))
@example(ISSUE_15_PAGES[0])
@example(ISSUE_15_PAGES[1])
@example(ISSUE_15_PAGES[2])
@example(ISSUE_15_PAGES[3])
@example(ISSUE_15_PAGES[4])
@example(ISSUE_15_PAGES[5])
@property_settings(GENERATED_EXAMPLES)
def _generated(text: str) -> None:
    RUNS['generated'] += 1
    check(text, legal=True)


def test_scanner_agrees_with_prometheus_client_on_generated_pages(request: pytest.FixtureRequest) -> None:
    RUNS['generated'] = 0
    _generated()
    record_examples(request, RUNS['generated'], GENERATED_EXAMPLES)


# -- mutations of the real pages of every engine ---------------------------------------------------
PAGE_LINES = [p.read_text().split("\n") for p in REAL_PAGES]
# Where each page's wanted lines are: windows are drawn around them, so mutations hit what is read.
WANTED_AT = [[i for i, line in enumerate(lines) if ALL.scan(line + "\n")] or [0] for lines in PAGE_LINES]
CHARS = ['{', '}', '"', '\\', ' ', '\t', '#', '_', 'e', '-', '+', ',', '=', '\r', '\x0c', 'x', '9', ' # ']
OPS = ["indent", "brace_blank", "tabs", "timestamp", "exemplar", "value", "crlf", "duplicate", "delete", "swap",
       "comment", "insert_char", "delete_char"]


def mutated_window(seed: int) -> str:
    """Up to 16 lines of a real page around a line a scanner reads, with 1-4 mutations."""
    rng = random.Random(seed)
    number = rng.randrange(len(PAGE_LINES))
    lines, anchors = PAGE_LINES[number], WANTED_AT[number]
    start = max(0, rng.choice(anchors) - rng.randint(0, 8))
    window = lines[start:start + rng.randint(1, 16)]
    for _ in range(rng.randint(1, 4)):
        op, at = rng.choice(OPS), rng.randrange(len(window))
        line = window[at]
        if op == "indent":
            window[at] = rng.choice(BLANKS) + line
        elif op == "brace_blank":
            window[at] = line.replace("{", rng.choice(BLANKS) + "{", 1)
        elif op == "tabs":
            window[at] = line.replace(" ", "\t")
        elif op == "timestamp":
            window[at] = line + " " + str(rng.randint(-10**13, 10**13))
        elif op == "exemplar":
            window[at] = line + ' # {trace_id="abc"} ' + value(rng)
        elif op == "value" and " " in line:
            window[at] = line.rsplit(" ", 1)[0] + " " + value(rng)
        elif op == "crlf":
            window[at] = line + "\r"
        elif op == "duplicate":
            window.insert(at, line)
        elif op == "delete" and len(window) > 1:
            del window[at]
        elif op == "swap":
            other = rng.randrange(len(window))
            window[at], window[other] = window[other], window[at]
        elif op == "comment":
            window.insert(at, "# " + line)
        elif op == "insert_char":
            pos = rng.randint(0, len(line))
            window[at] = line[:pos] + rng.choice(CHARS) + line[pos:]
        elif op == "delete_char" and line:
            pos = rng.randrange(len(line))
            window[at] = line[:pos] + line[pos + 1:]
    return "\n".join(window) + "\n"


@given(st.integers(0, 2**64).map(mutated_window))
@example(FOUND_PAGES[0])
@example(mutated_window(1424852))  # `## TYPE x counter` is a TYPE line to the client (a harness fix)
@property_settings(MUTATED_EXAMPLES)
def _mutated(text: str) -> None:
    RUNS['mutated'] += 1
    check(text, legal=False)


def test_scanner_agrees_with_prometheus_client_on_mutated_real_pages(request: pytest.FixtureRequest) -> None:
    assert len(REAL_PAGES) >= 5 and {p.parent.name for p in REAL_PAGES} >= {"vllm"}
    RUNS['mutated'] = 0
    _mutated()
    record_examples(request, RUNS['mutated'], MUTATED_EXAMPLES)


# -- the real pages themselves, whole ----------------------------------------------------------------
@pytest.mark.parametrize("path", REAL_PAGES, ids=[f"{p.parent.name}/{p.name}" for p in REAL_PAGES])
def test_scanner_agrees_with_prometheus_client_on_every_real_page(path: Path) -> None:
    text = path.read_text()
    assert client_samples(text, ALL.names) is not None, "prometheus-client refuses a real page"
    check(text, legal=True)


@pytest.mark.parametrize("text", ISSUE_15_PAGES)
def test_the_shapes_issue_15_found_read_as_prometheus_client_reads_them(text: str) -> None:
    check(text, legal=True)
    assert ALL.scan(text)["vllm:num_requests_running"][0].value in (7.0, 0.0, 3.0)


# -- the scanner's quick reading of a line against its exact one -------------------------------------
# The scanner reads a common line (a label set known well-formed, a lone number) without the regex of
# the whole line; every line must read as that regex and `_value` read it: the same samples, or the
# same PageError, detail included.
EXACT_LINE = re.compile(rf"\n\s*({_trie(ALL.names)})(?=[^\S\n]*[ \t{{])[^\S\n]*({_LABEL_SET})?([^\n]*)")
FRAGMENTS = ['{', '}', '"', '\\', '\\"', ' ', '\t', '#', ' # ', '_', 'e', '1', '7.5', '-2e3', 'NaN', '+Inf', 'inf',
             'a="x"', 'a="}"', ',', '=', '\r', '\x0c', 'é', '{a="b"}', '{engine="0"} ']


def exact_reading(text: str) -> object:
    found: dict[str, list[tuple[str, str]]] = {}
    try:
        for name, label_text, rest in EXACT_LINE.findall("\n" + text):
            found.setdefault(name, []).append((label_text, repr(value_of_line(name, label_text, rest))))
    except PageError as exc:
        return exc.reason, exc.detail
    return found


def quick_reading(text: str) -> object:
    try:
        return {name: [(s.label_text, repr(s.value)) for s in samples] for name, samples in ALL.scan(text).items()}
    except PageError as exc:
        return exc.reason, exc.detail


def fragment_page(seed: int) -> str:
    """A few lines, each a wanted name (maybe indented) and then 0-8 fragments of what may follow it."""
    rng = random.Random(seed)
    lines = []
    for _ in range(rng.randint(1, 4)):
        tail = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 8)))
        lines.append(rng.choice(MAYBE_BLANKS) + rng.choice(WANTED) + rng.choice(["", " ", "\t", "{"]) + tail)
    return "\n".join(lines) + "\n"


@given(st.one_of(st.integers(0, 2**64).map(fragment_page), st.integers(0, 2**64).map(page),
                 st.integers(0, 2**64).map(mutated_window)))
@example('vllm:num_requests_running{a="}"} 3\n')  # the first `}` is in a value: the exact path
@example('vllm:num_requests_running{a="x"} 1_000\n')  # float() takes 1_000, the format does not
@example('vllm:num_requests_running{a="x"} 7 # {trace_id="t"} 1.0\n')
@property_settings(EXACT_EXAMPLES)
def _quick_is_exact(text: str) -> None:
    RUNS['exact'] += 1
    assert quick_reading(text) == exact_reading(text), text


def test_the_scanners_quick_reading_of_a_line_is_its_exact_reading(request: pytest.FixtureRequest) -> None:
    RUNS['exact'] = 0
    _quick_is_exact()
    record_examples(request, RUNS['exact'], EXACT_EXAMPLES)
