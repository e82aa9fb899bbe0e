"""`llm-vitals-backtest`: what llm-vitals would have said and done over an operator's own Prometheus history.

Before anyone lets a program restart GPU servers, it replays the engines' own counters, as
Prometheus scraped them, through the exporter's pure verdict (`exporter.verdict.judge`, the
adapters' snapshots: one code path with the exporter), the alert rules' `for:` and the remediator's
pure gate, next to what a request-based watchdog would have done on the same history.

    history.py     pure: raw samples of one target -> one page per read, as the exporter would have read it
    replay.py      pure: reads -> verdicts, episodes, alerts, gate decisions, restarts seen, watchdog restarts
    rules.py       the alert rules' `for:` and labels, read from alerts/llm-vitals.rules.yml
    prometheus.py  the only I/O: chunked range-selector queries against Prometheus's HTTP API
    report.py      text and JSON
    html.py        the self-contained HTML page (matplotlib, imported only for --html)
    cli.py         the command line
"""
