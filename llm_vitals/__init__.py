"""Shared pieces of llm-vitals (config loading, durations, logging) for the exporter, remediator and simulator."""
