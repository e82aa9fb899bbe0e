"""llm-vitals simulator: a fleet of simulated vLLM 0.32 servers for demos and tests.

- `config`: `SimConfig`, the validated settings;
- `engine`: the pure engine model (continuous batching, chunked prefill, statistics), `step(now)`;
- `driver`: steps an engine in real time on the event loop; engine faults (hang, slow, kill);
- `metrics`: the /metrics page, rendered like vLLM's from the engine's numbers;
- `openai_api`: request validation and response shapes of the OpenAI-compatible routes;
- `server`: the aiohttp routes of one server lifetime, plus `/admin/*`;
- `backend`: one server across lifetimes (serving, dying, dead, loading);
- `proxy`, `control`, `fleet`, `cli`: the least-connection proxy, the control server, the
  in-process `Fleet` API and the `llm-vitals-sim` command.
"""
