"""`llm-vitals-remediator`: placeholder until the remediator issue lands."""

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-vitals-remediator",
        description="Alertmanager webhook receiver that performs one gated restart of a "
        "server shown to be stuck. (Not built yet.)",
    )
    parser.add_argument("--config", help="YAML config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config and exit")
    parser.parse_args(argv)
    print("llm-vitals-remediator is not built yet")
    return 2
