"""llm-vitals simulator: a fleet of simulated vLLM 0.32 servers for demos and tests.

- `config`: `SimConfig`, the validated settings;
- `engine`: the pure engine model (continuous batching, chunked prefill, statistics), `step(now)`;
- `driver`: steps an engine in real time on the event loop; engine faults (hang, slow, kill);
- `metrics`: the /metrics page, rendered like vLLM's from the engine's numbers;
- `openai_api`: request validation and response shapes of the OpenAI-compatible routes;
- `process`: one server lifetime (`ServerProcess`) and what every route reads of it;
- `completions`: the OpenAI-compatible routes (models, completions, chat), shared by the engines;
- `engines/`: one module per `--engine`, each defining `SIM_ENGINE` (its page, health and other
  routes), gathered by `engines/table.py`;
- `admin`: `/admin/*` and the app of one server lifetime;
- `backend`: one server across lifetimes (serving, dying, dead, loading);
- `proxy`, `control`, `fleet`, `cli`: the least-connection proxy, the control server, the
  in-process `Fleet` API and the `llm-vitals-sim` command.
"""
