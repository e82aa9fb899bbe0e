"""`llm-vitals-exporter`: placeholder until the exporter issue lands."""

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llm-vitals-exporter",
        description="Polls LLM servers' own metrics, caches a verdict per target, and serves "
        "Prometheus gauges and Kubernetes probes from that cache. (Not built yet.)",
    )
    parser.add_argument("--config", help="YAML config file")
    parser.add_argument("--check-config", action="store_true", help="validate the config and exit")
    parser.parse_args(argv)
    print("llm-vitals-exporter is not built yet")
    return 2
