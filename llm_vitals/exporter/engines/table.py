"""The engine table: one `Engine` per `engine:` value of the config (as blackbox_exporter's Probers map).

Each adapter module defines its own `ENGINE`; this module only gathers them, so an engine's owner
edits its own module and never this one. The poller and the verdict look entries up here.
"""

from __future__ import annotations

from dataclasses import replace

from llm_vitals.exporter.engines import Engine, Page, PageError, PageReading, header, llamacpp, openai, sglang, tgi, triton, vllm

ENGINES: dict[str, Engine] = {
    entry.name: entry
    for entry in (vllm.ENGINE, llamacpp.ENGINE, triton.ENGINE, sglang.ENGINE, tgi.ENGINE, openai.ENGINE)
}


def engine_of(name: str) -> Engine:
    """The table entry for a configured engine name (settings only admit names in the table)."""
    return ENGINES[name]


def identify(body: bytes) -> str | None:
    """The engine whose signature (a metric-name prefix only it uses) the page carries, or None."""
    for name, entry in ENGINES.items():
        if entry.signature is not None and entry.signature.encode() in body:
            return name
    return None


def read_page(entry: Engine, page: Page) -> PageReading:
    """`entry`'s PageReading of `page`; another engine's page is PageError("wrong_engine") naming both."""
    if entry.parse is None:
        raise PageError("bad_metrics", f"engine {entry.name} has no /metrics adapter")
    if entry.signature is not None and entry.signature.encode() not in page.body:
        owner = identify(page.body)
        if owner is not None:
            raise PageError("wrong_engine", f"target is declared {entry.name}, but the page is {owner}'s "
                                            f"({ENGINES[owner].signature}* families, no {entry.signature}*)")
    snapshot = entry.parse(page)
    if entry.restart_header is not None:
        token = header(page.headers, entry.restart_header)
        if token is not None:
            snapshot = replace(snapshot, restart_token=token)
    return snapshot
