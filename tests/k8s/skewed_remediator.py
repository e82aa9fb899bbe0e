"""A remediator whose clock is off by SKEW seconds, through `create_app`'s clock seam: one replica of
tests/k8s/test_workload_safety.py's pair judges everything by a clock a minute ahead of the other's.

    python tests/k8s/skewed_remediator.py CONFIG SKEW_SECONDS

Everything else is the CLI's: the config, its validation, the logging, the app.
"""

from __future__ import annotations

import sys
import time

from aiohttp import web

from llm_vitals.logs import setup_logging
from llm_vitals.remediator.app import create_app
from llm_vitals.remediator.settings import load_settings


def main() -> None:
    config, skew = sys.argv[1], float(sys.argv[2])
    settings = load_settings(config)
    setup_logging("debug")
    host, port = settings.host_port
    web.run_app(create_app(settings, clock=lambda: time.time() + skew), host=host, port=port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
