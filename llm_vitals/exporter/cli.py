"""`llm-vitals-exporter --config FILE [--check-config]`: validate the config, then serve."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

from llm_vitals import exits
from llm_vitals.config_cli import add_config_options, read_config
from llm_vitals.exporter.settings import load_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-vitals-exporter",
        description="Polls LLM servers' own metrics, caches a verdict per target, and serves "
        "Prometheus gauges and Kubernetes probes from that cache.",
    )
    add_config_options(parser)
    parser.add_argument("--log-level", help="override the config's log_level")
    args = parser.parse_args(argv)
    settings = read_config(parser, args, "exporter", load_settings,
                           lambda s: "".join([f"config OK: {len(s.targets)} target(s), {len(s.discovery)} discovery "
                                              f"source(s), listening on {s.listen}",
                                              *(f"\nwarning: {warning}" for warning in s.warnings())]))
    if isinstance(settings, int):
        return settings

    # Imported late so that --check-config stays fast and free of the web stack.
    from aiohttp import web

    from llm_vitals.exporter.app import create_app
    from llm_vitals.logs import setup_logging

    setup_logging(args.log_level or settings.log_level)
    for warning in settings.warnings():
        logging.getLogger("llm_vitals.exporter").warning("config: %s", warning)
    # SIGHUP and POST /-/reload re-read this file (llm_vitals/exporter/reload.py).
    app = create_app(settings, config_path=Path(args.config), sighup=True)
    # Everything built so far (modules, settings, one record per target) lives as long as the
    # process: out of the collector's sight, a full collection no longer walks it. In
    # bench_poll_1000 the worst probe answer during /metrics scrapes went from 50-100 ms in most
    # runs to under 40 ms in 7 runs of 8 (57 ms in one), and probe p99 from 31-63 ms to 27-38 ms.
    gc.freeze()
    # Each poll leaves ~10 objects the collector tracks that live one interval (its sleep's future
    # and timer, the new verdict, its rendered lines, ...), so at 5,000 targets every young
    # collection promoted thousands, and a full collection (~100,000 objects, 80-90 ms of CPU on
    # the loaded 2-core box) ran every 3 s, holding the loop each time. Young collections kept
    # small (1 ms), full ones gated to about one a minute and a half (bench/bench_scale.py).
    gc.set_threshold(500, 1, 2000)
    web.run_app(app, host=settings.host, port=settings.port, access_log=None, print=None)
    return exits.OK


if __name__ == "__main__":
    sys.exit(main())
