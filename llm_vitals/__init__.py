"""Shared pieces of llm-vitals: duration parsing and logging, used by the exporter, remediator and simulator."""
