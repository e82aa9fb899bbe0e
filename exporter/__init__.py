"""llm-vitals exporter."""
