"""`llm-vitals-remediator --config FILE [--check-config]`: the Alertmanager webhook receiver."""

from __future__ import annotations

import argparse
import logging
import sys

from aiohttp import web

from llm_vitals import exits
from llm_vitals.config_cli import add_config_options, read_config
from llm_vitals.logs import log_event, setup_logging

from .journal import JournalBusy
from .settings import load_settings
from .shared import BadState


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-vitals-remediator",
        description="Alertmanager webhook receiver that performs one gated restart of a server "
        "the exporter shows to be stuck: re-checked, one at a time, behind a global cooldown, a "
        "budget per workload and a fleet gate, with a durable SQLite journal.",
    )
    add_config_options(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    settings = read_config(parser, args, "remediator", load_settings,
                           lambda s: f"{args.config}: ok ({len(s.targets)} targets, auth: "
                                     f"{'none' if s.auth.none else 'required'}, dry_run: {s.dry_run})")
    if isinstance(settings, int):
        return settings

    setup_logging(args.log_level)
    log = logging.getLogger("llm_vitals.remediator")
    from .app import create_app  # after logging is set up

    host, port = settings.host_port
    log_event(log, "starting", listen=settings.listen, targets=sorted(settings.targets), dry_run=settings.dry_run,
              auth="none" if settings.auth.none else "required")
    try:
        web.run_app(create_app(settings), host=host, port=port, print=None, access_log=None)
    except (JournalBusy, BadState) as exc:  # another remediator on the journal; a state row not ours
        log_event(log, "cannot start", level=logging.ERROR, error=str(exc))
        return exits.CANNOT_RUN
    return exits.OK


if __name__ == "__main__":
    sys.exit(main())
