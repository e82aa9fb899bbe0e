"""Which `llm_vitals` modules one alert, or one poll, walks through, and how often it comes back to each (issue 42).

    .venv/bin/python tools/module_walk.py alert   # one firing alert: webhook payload -> decision; then its restart's task
    .venv/bin/python tools/module_walk.py poll    # one poll of one target by the exporter's poller
    .venv/bin/python tools/module_walk.py poll --packages   # a subpackage (verdict/, engines/, store/) as one module
    .venv/bin/python tools/module_walk.py alert --functions  # and each entry's function

Real parts, in-process, under `sys.setprofile` (and `threading.setprofile`):
- alert: the real `Remediator` service (its `GateLoop`, gate, `Actor`, journal and the SQLite store in a
  temporary directory) gets the captured Alertmanager payload aimed at target `a`; the fleet read and the
  executor are stubs, as tests/test_remediator_loop.py builds them, up to the webhook's answer. The restart
  it started runs in a task of its own, the second path (`restart`: the action, then its end through the
  ledger), watched while the tool waits for the task.
- poll: the exporter's `Poller.poll_once` on one vLLM target served from loopback with the real busy page
  (tests/fixtures/vllm/); one unwatched poll first, so the watched one is a steady-state read.

An entry is a call into a module's function from another module's (or from no `llm_vitals` frame: a task
the event loop starts, marked `*`); a call within one module, and a coroutine's or a generator's
resumption (its frame entered before), are no entry.
Pure data accessors are left out: functions without a source file under `llm_vitals/` (dataclass- and
NamedTuple-generated methods), properties, and an `__init__` that only stores attributes, with what they call.
Printed: the modules in the order entered (`m x3`: three entries in a row, from one caller), then each
module's entries and returns (entries after the first).
"""

from __future__ import annotations

import ast
import asyncio
import copy
import importlib
import inspect
import json
import pkgutil
import sys
import tempfile
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the checkout's package, whichever commit this file runs in
PACKAGE = REPO / "llm_vitals"
FIXTURES = REPO / "tests" / "fixtures"


def module_of(code: types.CodeType) -> str | None:
    """`remediator.loop` for a function in llm_vitals/remediator/loop.py; None outside the package."""
    path = Path(code.co_filename)
    if not path.is_absolute() or PACKAGE not in path.parents:
        return None  # also "<string>": what dataclasses and NamedTuple generate
    name = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
    return name.removesuffix(".__init__")


def _stores_only(function: Any) -> bool:
    """An `__init__` whose body only assigns attributes of `self` (a plain data type)."""
    try:
        tree = ast.parse(inspect.getsource(function).strip().replace("\n    ", "\n"))
    except (OSError, TypeError, SyntaxError):
        return False
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.FunctionDef) else []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else None
        if not targets:
            return False
        for target in targets:
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            if not all(isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" for e in elts):
                return False
    return True


def accessors() -> set[types.CodeType]:
    """The code of every property and every attribute-storing `__init__` in the package."""
    import llm_vitals

    found: set[types.CodeType] = set()
    for info in pkgutil.walk_packages(llm_vitals.__path__, "llm_vitals."):
        if info.name.endswith("__main__"):
            continue  # runs a command when imported
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional dependency missing: its module is not on these paths
            continue
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            for name, attr in vars(cls).items():
                if isinstance(attr, property):
                    found.update(f.__code__ for f in (attr.fget, attr.fset) if f is not None and hasattr(f, "__code__"))
                elif name == "__init__" and inspect.isfunction(attr) and _stores_only(attr):
                    found.add(attr.__code__)
    return found


class Walk:
    """The profile hook: records each entry into a module of the package."""

    def __init__(self, skip: set[types.CodeType], packages: bool = False) -> None:
        self.skip, self.packages = skip, packages
        self.entries: list[str] = []
        self.functions: list[str] = []  # each entry's function, for --functions
        self.seen: set[int] = set()
        self.frames: list[types.FrameType] = []  # kept alive so that their ids stay unique while watched

    def _module(self, frame: types.FrameType) -> str | None:
        code = frame.f_code
        module = None if code in self.skip else module_of(code)
        if module is not None and self.packages:
            module = ".".join(module.split(".")[:2])  # exporter.verdict.plan -> exporter.verdict
        return module

    def hook(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = self._module(frame)
        if module is None or id(frame) in self.seen:
            return  # outside the package, an accessor, or a coroutine or generator resumed
        self.seen.add(id(frame))
        self.frames.append(frame)
        caller = frame.f_back
        while caller is not None and self._module(caller) is None:
            if caller.f_code in self.skip:
                return  # what an accessor calls is part of it (`AlertFacts.key` -> `model.dedupe_key`)
            caller = caller.f_back
        if caller is None:
            self.entries.append(f"*{module}")  # started by the event loop (a task) or a thread
        elif self._module(caller) != module:
            self.entries.append(module)
        else:
            return
        self.functions.append(f"{self.entries[-1]}:{frame.f_code.co_qualname}")

    def __enter__(self) -> Walk:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


def runs(entries: list[str]) -> list[str]:
    """`m x3` for three entries in a row into `m` (its caller called it three times)."""
    out: list[tuple[str, int]] = []
    for entry in entries:
        if out and out[-1][0] == entry:
            out[-1] = (entry, out[-1][1] + 1)
        else:
            out.append((entry, 1))
    return [name if n == 1 else f"{name} x{n}" for name, n in out]


def report(title: str, entries: list[str]) -> str:
    """The path as printed: the modules in order, then each module's entries and returns."""
    counts = Counter(e.lstrip("*") for e in entries)
    lines = [f"{title}: {len(entries)} entries into {len(counts)} modules, "
             f"{sum(n - 1 for n in counts.values())} returns to a module already entered",
             "  " + " -> ".join(runs(entries)), "  module: entries (returns)"]
    lines += [f"    {name}: {n} ({n - 1})" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines)


# -- the alert ---------------------------------------------------------------------------------

STARTS_AT = "2026-12-02T14:38:36.417Z"
STARTS_AT_UNIX = 1796222316.417


class StubExecutor:
    """A restart that succeeds at once (tests/test_remediator_loop.py's `Held`, never held)."""

    kind = "http"
    timeout = 5.0

    async def restart(self) -> Any:
        from llm_vitals.remediator.executors import ExecResult

        return ExecResult("ok", "restarted")


class StubFleet:
    """The exporter's fleet view: `a` stuck, four idle peers (the fleet gate allows one in five)."""

    def __init__(self, view: Any) -> None:
        self.view = view

    async def fleet(self) -> Any:
        return self.view


def fleet_view() -> Any:
    try:
        from llm_vitals.remediator.model import FleetView, TargetStatus
    except ImportError:  # before the wave: in the gate
        from llm_vitals.remediator.gate import FleetView, TargetStatus
    old = STARTS_AT_UNIX - 3600.0
    return FleetView({name: TargetStatus("stuck" if name == "a" else "idle", process_start_time=old) for name in "abcde"})


async def walk_alert(skip: set[types.CodeType], packages: bool) -> list[tuple[str, Walk]]:
    from llm_vitals.remediator.journal import Journal
    from llm_vitals.remediator.payload import WebhookPayload
    from llm_vitals.remediator.service import Remediator, store_for
    from llm_vitals.remediator.settings import build_settings

    payload = json.loads((FIXTURES / "alertmanager" / "webhook-firing.json").read_text())
    alert = copy.deepcopy(payload["alerts"][0])
    alert["labels"].update(target="a", alertname="LLMServerStuck", remediation="restart")
    alert["startsAt"] = STARTS_AT
    payload["alerts"] = [alert]
    payload["commonLabels"] = dict(alert["labels"])
    now = [STARTS_AT_UNIX + 120.0]
    clock = lambda: now[0]  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        settings = build_settings({
            "listen": "127.0.0.1:0", "exporter_url": "http://127.0.0.1:1", "exporter_timeout": "2s",
            "auth": {"bearer_token_env": "TOKEN"}, "state_path": str(Path(tmp) / "journal.db"),
            "global_cooldown": "15m", "budget": {"max_restarts": 3, "window": "1h"}, "max_unhealthy": "40%",
            "targets": {n: {"executor": "http", "url": "http://127.0.0.1:1/restart", "timeout": "5s"} for n in "abcde"},
        }, {"TOKEN": "s3cret"})
        journal = Journal(settings.state_path)
        await journal.open(clock())
        try:
            async with store_for(settings, None, clock) as store:
                service = Remediator(settings, journal, store, None, clock, dict.fromkeys("abcde", StubExecutor()), None)  # type: ignore[arg-type]
                service.loop.exporter = StubFleet(fleet_view())
                parsed = WebhookPayload.model_validate(payload)
                with Walk(skip, packages) as walk:
                    outcome = await service.handle_payload(parsed)
                # The restart the answer started runs in a task of its own (acting.Actor._run): its own path,
                # waited for here without entering the package (service.wait_idle would be an entry).
                tasks = getattr(getattr(service, "actor", None), "_tasks", None)
                with Walk(skip, packages) as restart:
                    await (asyncio.gather(*list(tasks)) if tasks is not None else service.wait_idle())
                await service.shutdown()
        finally:
            await journal.close()
    decided = [d["decision"] for d in outcome.decisions]
    if decided != ["restart"]:
        raise SystemExit(f"the alert was not allowed: {outcome.decisions}")
    return [("alert", walk), ("restart", restart)]


# -- the poll ----------------------------------------------------------------------------------


async def walk_poll(skip: set[types.CodeType], packages: bool) -> list[tuple[str, Walk]]:
    import aiohttp
    from aiohttp import web

    from llm_vitals.exporter.poller import Poller
    from llm_vitals.exporter.settings import parse_settings
    from llm_vitals.exporter.state import StateStore

    page = (FIXTURES / "vllm" / "vllm-0.32.0-cpu-metrics-busy.txt").read_bytes()


    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        settings = parse_settings({"listen": "127.0.0.1:0", "poll_interval": 5, "metrics_timeout": 2,
                                   "targets": [{"name": "a", "url": f"http://127.0.0.1:{port}", "startup_grace": 0}]},
                                  "module_walk", environ={})
        store = StateStore(settings, 0.0)
        async with aiohttp.ClientSession() as session:
            poller = Poller(settings, store, session)
            record = store.get("a")
            assert record is not None
            await poller.poll_once(record)  # the first read (starting -> a verdict), not watched
            with Walk(skip, packages) as walk:
                await poller.poll_once(record)
            await poller.stop()
    finally:
        await runner.cleanup()
    return [("poll", walk)]


def main(argv: list[str]) -> int:
    paths = {"alert": walk_alert, "poll": walk_poll}
    packages, functions = "--packages" in argv, "--functions" in argv
    argv = [arg for arg in argv if arg not in ("--packages", "--functions")]
    if len(argv) != 1 or argv[0] not in paths:
        print(f"usage: {Path(__file__).name} alert|poll [--packages] [--functions]", file=sys.stderr)
        return 2
    skip = accessors()
    walks = asyncio.run(paths[argv[0]](skip, packages))
    for title, walk in walks:
        print(report(title + (" (by package)" if packages else ""), walk.entries))
        if functions:
            print("  functions entered, in order:")
            print("\n".join(f"    {name}" for name in walk.functions))
    if len(walks) > 1:  # the paths one after the other: what the task enters again of what the answer entered
        print(report(" then ".join(title for title, _ in walks) + (" (by package)" if packages else ""),
                     [entry for _, walk in walks for entry in walk.entries]).split("\n")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
