"""The exit codes of both CLIs (llm-vitals-exporter and llm-vitals-remediator), and how they report a bad config."""

from __future__ import annotations

import sys

from llm_vitals.config import ConfigError

OK = 0
# Cannot run as configured: an invalid config (also what --check-config answers for one), or the
# remediator's journal held by another remediator.
CANNOT_RUN = 1
USAGE = 2  # a bad command line: argparse's own code


def invalid_config(prog: str, exc: ConfigError) -> int:
    """Say why the config cannot be used (the message names the file and the key) and return CANNOT_RUN."""
    print(f"{prog}: invalid config: {exc}", file=sys.stderr)
    return CANNOT_RUN
