"""`llm-vitals-backtest`: replay a Prometheus history through llm-vitals before it restarts anything.

    llm-vitals-backtest --prometheus http://prometheus:9090 --start 2026-11-28T00:00:00Z --end 2026-12-05T00:00:00Z \\
        [--step 15s] [--selector '{job="vllm"}'] [--config exporter.yaml] [--json] [--html FILE] [--watchdog-timeout 10s]
        [--rules FILE] [--jobs N] [--incidents FILE] [--compare-live]

Exit codes: 0 when anything could be read (what could not is said on its own line), 1 when nothing
could (Prometheus unreachable, no engine series in the window, a bad config or rules file), 2 for
a bad command line.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from llm_vitals import exits
from llm_vitals.backtest import report
from llm_vitals.backtest.incidents import IncidentsError, load_incidents, timestamp
from llm_vitals.backtest.prometheus import Prometheus, PrometheusError, selector_matchers
from llm_vitals.backtest.rules import RulesError, load_rules
from llm_vitals.backtest.run import Options, Window, backtest
from llm_vitals.config import ConfigError
from llm_vitals.config_cli import add_version_option
from llm_vitals.durations import parse_positive_duration
from llm_vitals.examples import example_config
from llm_vitals.exporter.settings import load_settings

PROG = "llm-vitals-backtest"


def parse_time(text: str) -> float:
    """Unix seconds, or RFC 3339 (`2026-12-05T06:00:00Z`, with an offset or Z)."""
    try:
        return timestamp(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return parse_positive_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cores() -> int:
    """The cores this process may run on: a container's cpuset or a `taskset`, not every core of the host
    (os.cpu_count's), which would start more reading processes than there are cores to run them."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="What llm-vitals would have said and done over your own Prometheus history (the engines' "
                    "counters as Prometheus scraped them), next to what a request-based watchdog would have done.",
    )
    add_version_option(parser)
    parser.add_argument("--prometheus", metavar="URL", help="the Prometheus that scrapes the engines (required)")
    parser.add_argument("--start", type=parse_time, metavar="T", help="Unix seconds or RFC 3339 (required)")
    parser.add_argument("--end", type=parse_time, metavar="T", help="Unix seconds or RFC 3339 (required)")
    parser.add_argument("--step", type=_duration, default=15.0, metavar="DURATION",
                        help="one read every STEP, each seeing the latest scrape within it (default 15s: use the "
                             "scrape interval)")
    parser.add_argument("--selector", default=None, metavar="'{job=\"vllm\"}'",
                        help="label matchers added to every query")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="the exporter's config: its targets' settings, matched to series by instance "
                             "(default: the exporter's defaults, the engine read from the families present; "
                             "`--example-config` prints a commented one)")
    parser.add_argument("--example-config", action="store_true",
                        help="print the exporter's example config shipped with the package (the --config this "
                             "takes), and exit")
    parser.add_argument("--rules", type=Path, default=None, metavar="FILE",
                        help="the alert rules whose for: durations are replayed (default: the shipped "
                             "alerts/llm-vitals.rules.yml)")
    parser.add_argument("--watchdog-timeout", type=_duration, default=10.0, metavar="DURATION",
                        help="the request-based watchdog's probe timeout to compare with (default 10s)")
    parser.add_argument("--timeout", type=_duration, default=60.0, metavar="DURATION",
                        help="per Prometheus query (default 60s)")
    parser.add_argument("--jobs", type=int, default=cores(), metavar="N",
                        help="read and replay the targets in N processes (default: the cores, here "
                             f"{cores()}; the gate runs once, over all)")
    parser.add_argument("--incidents", type=Path, default=None, metavar="FILE",
                        help="your own incidents (YAML or CSV: target or selector, start, end, kind hang|slow|down, "
                             "note): each policy's caught, missed, false alarms and lead time (docs/backtest.md)")
    parser.add_argument("--compare-live", action="store_true",
                        help="where this Prometheus also scraped the exporter: per target, how often its own "
                             "llm_vitals_state agreed with the replay, and every disagreement longer than two scrapes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of text")
    parser.add_argument("--html", type=Path, default=None, metavar="FILE",
                        help="also write a self-contained HTML page (needs the `html` extra: matplotlib)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.example_config:
        sys.stdout.write(example_config("exporter"))
        return exits.OK
    missing = [flag for flag, value in (("--prometheus", args.prometheus), ("--start", args.start),
                                        ("--end", args.end)) if value is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    if args.end <= args.start:
        print(f"{PROG}: --end must be after --start", file=sys.stderr)
        return exits.USAGE
    try:
        matchers = selector_matchers(args.selector)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exits.USAGE
    try:
        rules = load_rules(args.rules)
        config = load_settings(args.config) if args.config is not None else None
        incidents = load_incidents(args.incidents) if args.incidents is not None else None
    except (RulesError, IncidentsError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exits.CANNOT_RUN
    except ConfigError as exc:
        return exits.invalid_config(PROG, exc)
    if args.html is not None:
        try:
            import matplotlib  # noqa: F401  (checked before a long read, not after)
        except ImportError:
            print(f"{PROG}: --html needs matplotlib: pip install 'llm-vitals[html]'", file=sys.stderr)
            return exits.CANNOT_RUN

    def progress(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    if args.jobs < 1:
        print(f"{PROG}: --jobs must be at least 1", file=sys.stderr)
        return exits.USAGE
    options = Options(rules=rules, matchers=matchers, watchdog_timeout=args.watchdog_timeout, config=config,
                      trace=args.html is not None, progress=progress, jobs=args.jobs, incidents=incidents,
                      compare_live=args.compare_live,
                      source_factory=functools.partial(Prometheus, args.prometheus, timeout=args.timeout))
    source = Prometheus(args.prometheus, timeout=args.timeout)
    try:
        result = backtest(source, Window(args.start, args.end, args.step), options)
    except PrometheusError as exc:
        print(f"{PROG}: nothing could be read: {exc}", file=sys.stderr)
        return exits.CANNOT_RUN
    finally:
        source.close()
    sys.stdout.write(report.dumps(result) if args.json else report.as_text(result))
    if args.html is not None:
        from llm_vitals.backtest import html

        args.html.write_text(html.page(result), encoding="utf-8")
        progress(f"wrote {args.html}")
    if not result.read_anything:
        for note in result.notes:
            print(f"{PROG}: {note.text}", file=sys.stderr)
        return exits.CANNOT_RUN
    return exits.OK


if __name__ == "__main__":
    raise SystemExit(main())
