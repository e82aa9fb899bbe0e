"""`make demo`: the whole chain on one machine, with a scripted story.

A simulated fleet (three vLLM-like backends behind a proxy), the exporter, the remediator (`http`
executor against the simulator's control server), and the alert path between them (the real
Prometheus + Alertmanager when installed, else a small relay posting Alertmanager-shaped
webhooks), then a story that loops: load that is not a fault, a hang that is, a pair of hangs that
meet the global cooldown, and a fleet-wide hang that the fleet gate refuses to "fix".

Run `python -m llm_vitals.demo --help`. Modules: `timings` (how fast the story runs), `ports`, `configs`
(the files each process reads), `processes` (children by PID and process group), `alerts`
(Prometheus/Alertmanager or the relay), `load` (clients), `story` (the steps and their checks),
`table` (the terminal view), `cli`.
"""
