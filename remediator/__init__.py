"""llm-vitals remediator."""
