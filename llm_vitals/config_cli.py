"""The config options both CLIs take (llm-vitals-exporter, llm-vitals-remediator), and what they do.

`--config FILE` names the YAML config; `--check-config` validates it and exits (0 valid, 1 not:
llm_vitals/exits.py); `--example-config` prints the example config shipped with the package and exits;
`--version` (every console script, the simulator's too) prints the installed package's version.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import metadata
from typing import Literal, TypeVar

from llm_vitals import exits
from llm_vitals.config import ConfigError
from llm_vitals.examples import example_config

Settings = TypeVar("Settings")


def package_version() -> str:
    """The installed llm-vitals distribution's version; `unknown` when run from a checkout not installed."""
    try:
        return metadata.version("llm-vitals")
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """Add `--version`: the program's name and the package's version, then exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")


def add_config_options(parser: argparse.ArgumentParser,
                       config_help: str = "YAML config file (`--example-config` prints a commented one)") -> None:
    """Add `--config`, `--check-config`, `--example-config` and `--version`."""
    add_version_option(parser)
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--check-config", action="store_true", help="validate the config and exit (0 valid, 1 not)")
    parser.add_argument("--example-config", action="store_true",
                        help="print the example config shipped with the package, and exit")


def read_config(parser: argparse.ArgumentParser, args: argparse.Namespace, tool: Literal["exporter", "remediator"],
                load: Callable[[str], Settings], summary: Callable[[Settings], str]) -> Settings | int:
    """The settings `--config` names, to run with; or the exit code when there is nothing more to run.

    That is `--example-config` (printed, OK), a config that does not load (said on stderr with the
    file and the key, CANNOT_RUN), or `--check-config` of one that does (its `summary` printed, OK).
    No `--config` at all is a usage error (argparse exits 2).
    """
    if args.example_config:
        print(example_config(tool), end="")
        return exits.OK
    if args.config is None:
        parser.error("the following arguments are required: --config")
    try:
        settings = load(args.config)
    except ConfigError as exc:
        return exits.invalid_config(parser.prog, exc)
    if args.check_config:
        print(summary(settings))
        return exits.OK
    return settings
