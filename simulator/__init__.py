"""llm-vitals simulator."""
