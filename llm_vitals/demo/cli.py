"""`python -m llm_vitals.demo` (`make demo`): start everything, tell the story, stop everything on Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from llm_vitals.demo import alerts
from llm_vitals.demo.configs import TOKEN_ENV, backend_name, decisions_command, engine_target_name, write_all
from llm_vitals.demo.ports import BACKENDS, MIXED_ENGINES, Ports, choose_ports
from llm_vitals.demo.processes import Children, StartError, answers_200
from llm_vitals.demo.story import Observer, Status, StepResult, StepTimeout, Story
from llm_vitals.demo.table import Screen, render
from llm_vitals.demo.timings import FAST, NORMAL, Timings
from llm_vitals.exporter.settings import ConfigError, load_settings
from llm_vitals.sim.engines.table import sim_engine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m llm_vitals.demo",
        description="Run a simulated vLLM fleet, the llm-vitals exporter and remediator, and the alert path "
        "between them, and loop a scripted story of load and hangs. Ctrl-C stops everything.",
    )
    parser.add_argument("--once", action="store_true", help="run the story one time, print a summary, and exit "
                        "(0 when every step went as told, 1 otherwise)")
    parser.add_argument("--no-table", action="store_true", help="log lines instead of the live table "
                        "(the default when stdout is not a terminal)")
    parser.add_argument("--fast", action="store_true", default=os.environ.get("LLM_VITALS_DEMO_FAST") == "1",
                        help="compressed timings (stuck after 3 s, cooldown 8 s): for tests "
                        "(also LLM_VITALS_DEMO_FAST=1)")
    parser.add_argument("--alerts", choices=("auto", "prometheus", "relay"), default="auto",
                        help="alert path: the real Prometheus + Alertmanager, or the demo's own relay posting "
                        "Alertmanager webhooks; auto = prometheus when both binaries are installed")
    parser.add_argument("--free-ports", action="store_true", help="always use kernel-chosen free ports, "
                        "not the defaults (8100-8104, 9471-9474)")
    parser.add_argument("--workdir", type=Path, help="keep configs, logs and the journal here "
                        "(default: a temporary directory, removed on exit)")
    parser.add_argument("--summary-json", type=Path, help="with --once: also write the summary as JSON here")
    parser.add_argument("--config", type=Path, help="an exporter config of your own: watch its servers instead of "
                        "the simulated fleet, with the same table. Only the exporter runs: no story, and the demo "
                        "restarts nothing. `make demo` passes ./exporter.yaml when it exists, or CONFIG=FILE")
    args = parser.parse_args(argv)
    if args.config and args.once:
        parser.error("--once tells the simulated fleet's story; with --config there is no story to end")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(Demo(args).run())
    except KeyboardInterrupt:  # Ctrl-C before the demo's own handler is installed, or after it is removed
        return 130


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.timings: Timings = FAST if args.fast else NORMAL
        self.table = not args.no_table and sys.stdout.isatty()
        self.status = Status()
        self.stopped_by: str | None = None

    def event(self, text: str) -> None:
        self.status.events.append((time.time(), text))
        if not self.table:
            print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)

    def say(self, text: str) -> None:
        print(text, flush=True)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        assert main_task is not None

        shutting_down = False

        def stop(signame: str) -> None:
            # A signal during the cleanup below (after the story ended or a child died) must not
            # cancel it half-way and leave children running: it is ignored, since each child gets
            # SIGKILL after its grace anyway.
            if self.stopped_by is None and not shutting_down:
                self.stopped_by = signame
                main_task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig.name)

        own_dir = self.args.workdir is None
        run_dir = Path(tempfile.mkdtemp(prefix="llm-vitals-demo-")) if own_dir else self.args.workdir.resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        children = Children(run_dir)
        code = 1
        tasks: list[asyncio.Task[Any]] = []
        story: Story | None = None
        try:
            async with aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=None)) as session:
                if self.args.config:
                    tasks = await self.start_watching(session, children, run_dir)
                    await asyncio.Event().wait()  # until Ctrl-C, SIGTERM or the exporter exiting
                else:
                    story, tasks = await self.start(session, children, run_dir)
                    code = await self.tell(story)
        except asyncio.CancelledError:
            if self.stopped_by:
                self.say(f"\n{self.stopped_by}: stopping every process the demo started")
                code = 0
            else:
                self.say("\na process of the demo exited on its own: stopping the others")
                code = 1
        except StartError as exc:
            self.say(f"\ncould not start the demo: {exc}")
            code = 1
        except StepTimeout as exc:
            self.say(f"\nthe demo could not get going: {exc}")
            code = 1
        finally:
            shutting_down = True
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                if story is not None:
                    await story.stop_load()
            pids = [c.pid for c in children.started]
            await children.stop_all()
            self.say(f"stopped {len(pids)} processes (pids {', '.join(map(str, pids)) or '-'})")
            if own_dir and code == 0:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                self.say(f"configs, logs and the remediator's journal are in {run_dir}")
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return code

    async def start(self, session: aiohttp.ClientSession, children: Children, run_dir: Path) -> tuple[Story, list[asyncio.Task[Any]]]:
        t = self.timings
        ports, notes = choose_ports(prefer_defaults=not self.args.free_ports)
        token = secrets.token_urlsafe(24)
        files = write_all(run_dir, ports, t, token)
        py = sys.executable
        base = "http://127.0.0.1"
        exporter_url, remediator_url = f"{base}:{ports.exporter}", f"{base}:{ports.remediator}"
        control_url, proxy_url = f"{base}:{ports.control}", f"{base}:{ports.proxy}"
        backend_urls = [f"{base}:{ports.backend_port(i)}" for i in range(BACKENDS)]
        for note in notes:
            self.say(note)

        binaries = alerts.find_monitoring_binaries()
        if self.args.alerts == "prometheus" and binaries is None:
            raise StartError("--alerts prometheus: `prometheus` and `prometheus-alertmanager` are not both installed "
                             "(apt-get install prometheus prometheus-alertmanager)")
        await self.start_fleet(session, children, ports)
        exporter = await children.start("exporter", [py, "-m", "llm_vitals.exporter.cli", "--config", str(files["exporter"])])
        await exporter.wait_ready(session, f"{exporter_url}/healthz", timeout=30)
        remediator = await children.start("remediator", [py, "-m", "llm_vitals.remediator.cli", "--config", str(files["remediator"])],
                                          env={TOKEN_ENV: token})
        await remediator.wait_ready(session, f"{remediator_url}/healthz", timeout=30)
        tasks: list[asyncio.Task[Any]] = []
        self.alert_path = path = await self.start_alert_path(session, children, binaries, ports, files, run_dir, token, tasks)

        # The observer reads the journal as the status page does: with the read token only.
        observer = Observer(session, exporter_url, remediator_url, self.event, files["read_token"].read_text().strip())
        tasks.append(asyncio.create_task(observer.run(max(0.25, t.poll_interval / 2))))
        self.show_header([
            "llm-vitals demo: a simulated vLLM fleet, the exporter, the remediator" + (" (fast timings)" if self.args.fast else ""),
            *(["  mixed fleet   also watched: " + ", ".join(f"{e} {base}:{p}" for e, p in ports.engines)] if ports.engines else []),
            f"  status page   {exporter_url}/",
            f"  exporter API  {exporter_url}/api/v1/targets     metrics {exporter_url}/metrics",
            f"  remediator    {remediator_url}/api/v1/actions   (http executor -> {control_url}/backends/N/restart; "
            f"cooldown {t.cooldown:g}s, max_unhealthy 2)",
            f"  decisions     {decisions_command(remediator_url, files['read_token'])}",
            f"  tokens        act {files['token']} (the webhook, pause, reset)   read {files['read_token']} "
            "(the status page, the journal)",
            f"  {path}",
            f"  logs          {run_dir}    Ctrl-C stops everything",
        ])
        story = Story(session, observer, t, control_url, proxy_url, backend_urls, self.status)
        if self.table:
            tasks.append(asyncio.create_task(self.redraw(observer)))
        main_task = asyncio.current_task()
        assert main_task is not None
        tasks.append(asyncio.create_task(self.watch(children, main_task)))
        return story, tasks

    async def start_fleet(self, session: aiohttp.ClientSession, children: Children, ports: Ports) -> None:
        """The simulated vLLM backends behind their proxy, and one server of each other engine beside them."""
        py, base, t = sys.executable, "http://127.0.0.1", self.timings
        control_url, proxy_url = f"{base}:{ports.control}", f"{base}:{ports.proxy}"
        backend_urls = [f"{base}:{ports.backend_port(i)}" for i in range(BACKENDS)]
        self.say(f"starting the simulated fleet: backends {backend_urls[0]}..:{ports.backend_port(BACKENDS - 1)}, "
                 f"proxy {proxy_url}, control {control_url}")
        sim = await children.start("simulator", [
            py, "-m", "llm_vitals.sim.cli", "--backends", str(BACKENDS), "--port", str(ports.backend),
            "--proxy", str(ports.proxy), "--control-port", str(ports.control), "--max-num-seqs", "4",
            # 60 engine steps/s per backend, not the default 200: the same story for a quarter of the CPU.
            "--tokens-per-second", "60",
            "--startup-seconds", f"{t.startup_seconds:g}", "--log-level", "warning"])
        await sim.wait_ready(session, f"{control_url}/health", timeout=30)
        for url in backend_urls:
            await sim.wait_ready(session, f"{url}/health", timeout=30)

        for engine, port in ports.engines:
            self.say(f"starting a simulated {engine} server beside them: {base}:{port} (watched, outside the story)")
            other = await children.start(f"simulator-{engine}", [
                py, "-m", "llm_vitals.sim.cli", "--engine", engine, "--backends", "1", "--port", str(port), "--no-control",
                "--max-num-seqs", "4", "--tokens-per-second", "60", "--log-level", "warning"])
            await other.wait_ready(session, f"{base}:{port}{sim_engine(engine).health[0][0]}", timeout=30)

    async def start_alert_path(self, session: aiohttp.ClientSession, children: Children, binaries: tuple[str, str] | None, ports: Ports,
                               files: dict[str, Path], run_dir: Path, token: str, tasks: list[asyncio.Task[Any]]) -> str:
        """The real Prometheus and Alertmanager where installed (unless --alerts relay), else the demo's relay
        (a task added to `tasks`); the alert path, in words."""
        base, t = "http://127.0.0.1", self.timings
        exporter_url, remediator_url = f"{base}:{ports.exporter}", f"{base}:{ports.remediator}"
        if binaries is not None and self.args.alerts != "relay":
            self.say("starting the real Prometheus and Alertmanager (rules from alerts/llm-vitals.rules.yml, "
                     f"for: {t.rule_for:g}s; routing from alerts/alertmanager.yml)")
            await alerts.start_prometheus_stack(children, session, binaries, ports, files, run_dir)
            path = (f"alert path: Prometheus {base}:{ports.prometheus} -> Alertmanager {base}:{ports.alertmanager} "
                    f"-> remediator webhook")
        else:
            why = "--alerts relay" if self.args.alerts == "relay" else "prometheus/prometheus-alertmanager not installed"
            relay = alerts.WebhookRelay(exporter_url, remediator_url, token, t,
                                        frozenset(backend_name(i) for i in range(BACKENDS)))
            tasks.append(asyncio.create_task(relay.run(session)))
            path = (f"alert path: the demo's relay posts Alertmanager v4 webhooks to the remediator when the exporter "
                    f"says stuck ({why})")
        return path

    def show_header(self, header: list[str]) -> None:
        """What runs where, said once; the table repeats it above itself each redraw."""
        self.header = header
        if not self.table:
            for line in header:
                self.say(line)
            self.say("")
            return
        # The table clips its lines to the terminal: the command and the token paths are said
        # once in full above it, where they stay to be copied.
        for line in header:
            if line.startswith(("  decisions", "  tokens")):
                self.say(line)

    async def start_watching(self, session: aiohttp.ClientSession, children: Children, run_dir: Path) -> list[asyncio.Task[Any]]:
        """`--config`: the exporter on the user's own servers, and the table. Nothing else is started:
        restarting a real server is the remediator's job, behind its gate, never a demo's."""
        path = self.args.config.resolve()
        try:
            settings = load_settings(path)
        except ConfigError as exc:
            raise StartError(f"invalid config: {exc}") from None
        host = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
        exporter_url = f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"
        remediator_url = str(settings.remediator_url).rstrip("/") if settings.remediator_url else None

        if await answers_200(session, f"{exporter_url}/healthz", timeout=1):
            self.say(f"an exporter already answers at {exporter_url}: showing its targets, not starting another")
        else:
            self.say(f"watching the {len(settings.targets)} target(s) of {path} (no simulator, no story; "
                     "the demo restarts nothing)")
            exporter = await children.start("exporter", [sys.executable, "-m", "llm_vitals.exporter.cli", "--config", str(path)])
            await exporter.wait_ready(session, f"{exporter_url}/healthz", timeout=30)

        # The journal is read with the token the status page holds (the config's remediator_token, the
        # remediator's read token); without one, the act token in LLM_VITALS_WEBHOOK_TOKEN, if any.
        token = settings.remediator_token.get_secret_value() if settings.remediator_token else None
        observer = Observer(session, exporter_url, remediator_url, self.event,
                            token or os.environ.get("LLM_VITALS_WEBHOOK_TOKEN"))
        self.status.step = "watching your servers"
        self.status.detail = "state changes other than idle <-> busy are listed below"
        self.show_header([
            f"llm-vitals: watching the servers of {path}",
            f"  status page   {exporter_url}/",
            f"  exporter API  {exporter_url}/api/v1/targets     metrics {exporter_url}/metrics",
            f"  remediator    {remediator_url}/api/v1/actions" if remediator_url else
            "  remediator    (no remediator_url in the config: no decisions shown)",
            f"  logs          {run_dir}    Ctrl-C stops what the demo started",
        ])
        main_task = asyncio.current_task()
        assert main_task is not None
        tasks = [asyncio.create_task(observer.run(max(0.25, settings.poll_interval / 2))),
                 asyncio.create_task(self.watch(children, main_task))]
        if self.table:
            tasks.append(asyncio.create_task(self.redraw(observer)))
        return tasks

    async def redraw(self, observer: Observer) -> None:
        screen = Screen(sys.stdout)
        self.say("")
        while True:
            screen.draw(render(observer, self.status, self.header))
            await asyncio.sleep(0.5)

    async def watch(self, children: Children, main_task: asyncio.Task[Any]) -> None:
        """A child that dies on its own ends the demo (with its log), instead of a story that hangs."""
        while True:
            dead = children.exited()
            if dead:
                self.say("\n" + "\n".join(f"{c.name} exited unexpectedly (status {c.returncode})\n{c.log_tail()}"
                                          for c in dead))
                main_task.cancel()
                return
            await asyncio.sleep(0.5)

    async def tell(self, story: Story) -> int:
        await story.warm_up()

        async def on_step(result: StepResult) -> None:
            verdict = "as told" if result.ok else "NOT as told"
            self.event(f"step {result.name}: {verdict}" + (f" ({result.error})" if result.error else ""))
            for text, passed in result.checks:
                if not passed:
                    self.event(f"  failed check: {text}")

        if not self.args.once:
            while True:
                await story.run_once(on_step)
        results = await story.run_once(on_step)
        summary = self.summary(story, results, await story.observer.status_page())
        if self.table:
            self.say("")
        self.say(format_summary(summary))
        if self.args.summary_json:
            self.args.summary_json.write_text(json.dumps(summary, indent=2))
        return 0 if summary["ok"] else 1

    def summary(self, story: Story, results: list[StepResult], status_page: dict[str, Any]) -> dict[str, Any]:
        actions = story.observer.actions
        # The mixed fleet's servers are outside the story: each must simply read healthy at the end.
        mixed = {name: story.observer.state(name) for name in (engine_target_name(e) for e in MIXED_ENGINES)}
        # The status page reads the journal with the read token: its panel shows the story's decisions.
        page_ok = status_page["decisions"] > 0 and status_page["note"] is None
        return {
            "ok": all(r.ok for r in results) and all(state in ("idle", "busy") for state in mixed.values()) and page_ok,
            "mixed_fleet": mixed,
            "status_page": status_page,
            "alert_path": self.alert_path,
            "timings": dataclasses.asdict(self.timings),
            "steps": [r.summary(story.observer) for r in results],
            "restarts": {backend_name(i): story.observer.restarts_of(backend_name(i)) for i in range(BACKENDS)},
            "decisions": dict(Counter(f"{a['decision']}:{a['reason']}" for a in actions)),
        }


def format_summary(summary: dict[str, Any]) -> str:
    lines = ["", "story summary (" + ("every step as told" if summary["ok"] else "SOME STEPS NOT AS TOLD") + ")",
             f"  {summary['alert_path']}"]
    for step in summary["steps"]:
        lines.append(f"  [{'ok' if step['ok'] else 'FAIL'}] {step['title']}  ({step['seconds']:.0f}s)")
        restarts = ", ".join(f"{t} x{n}" for t, n in sorted(step["restarts"].items())) or "none"
        refusals = ", ".join(f"{r} x{n}" for r, n in sorted(step["refusals"].items())) or "none"
        lines.append(f"         restarts: {restarts}; refusals: {refusals}")
        for check in step["checks"]:
            lines.append(f"         {'✓' if check['ok'] else '✗'} {check['check']}")
        if step["error"]:
            lines.append(f"         ✗ {step['error']}")
    if summary.get("mixed_fleet"):
        lines.append("  mixed fleet (outside the story): " + ", ".join(f"{t} {s}" for t, s in summary["mixed_fleet"].items()))
    if "status_page" in summary:
        page = summary["status_page"]
        lines.append(f"  status page: {page['decisions']} decisions shown" + (f" ({page['note']})" if page["note"] else ""))
    lines.append("  restarts per target: " + ", ".join(f"{t} {n}" for t, n in summary["restarts"].items()))
    lines.append("  decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["decisions"].items())))
    return "\n".join(lines)
