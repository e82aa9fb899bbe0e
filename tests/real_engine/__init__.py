"""The kit every real-engine tier (tests/real_vllm/, real_sglang/, real_triton/, real_llamacpp/) runs on.

A drill is written once (`drills.py`) and judges the real exporter (`harness.py`) against whatever
engine it is handed: an `Engine` (`engine.py`) that brings only its launcher (a `ServerProcess`,
`launcher.py`), its fault hooks (which process or thread to freeze or kill) and its facts (states,
timings, which checks apply). Load comes from one generator (`load.py`), results go to one report
and one summary table (`report.py`), and a tier's conftest imports its fixtures from `fixtures.py`.

Imported as `real_engine` (tests/ is on sys.path under pytest, as for `real_tier`). Nothing here
imports at package level, so tools/real-engine-report.py can load `report.py` with the stdlib alone.
"""
