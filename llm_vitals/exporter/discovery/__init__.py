"""Targets that come and go (docs/states.md): pods in Kubernetes, Prometheus file_sd files, and the
rules that turn them into the poller's targets.

- `targetset`: the pure rules: a discovered target's settings, the shard rule, the desired set and the reconcile step.
- `source`: what a source is to the manager (`Source`) and what it reports (`Report`, `SourceStatus`).
- `file_sd`: Prometheus file_sd documents -> targets (pure), and the loop that re-reads the files on change.
- `kubernetes`: pods -> targets (pure), and the list-then-watch loop against the API server.
- `manager`: the edge that joins them: each source's latest list in, the poller's targets out.
"""
