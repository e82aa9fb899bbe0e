"""The backstop's ask: every `backstop.interval`, the remediator's word for the watched workloads.

I/O only; the answer's shape is llm_vitals/backstop_word.py's (`word_in`), what a word means is
exporter/backstop_rule.py's (`heard`, `held`). The channel is the remediator's read-only API
(GET /api/v1/backstop, the read token `remediator_token_*`): the server's pod needs no Kubernetes API
token, the word is as fresh as one ask (a ConfigMap the kubelet mounts lags by up to its sync period,
a minute or two), and an answer is also the proof that the remediator is alive, which decides which
way a doubt goes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence

import aiohttp
from pydantic import SecretStr

from llm_vitals.backstop_word import BackstopWord, word_in
from llm_vitals.exporter.clock import Clock
from llm_vitals.exporter.settings import BackstopSettings
from llm_vitals.exporter.state import StateStore
from llm_vitals.http_body import read_upto
from llm_vitals.logs import log_event

log = logging.getLogger("llm_vitals.exporter")

BODY_LIMIT = 256 * 1024
ASK_LIMIT = 100  # workloads per ask: what GET /api/v1/backstop takes


async def ask(session: aiohttp.ClientSession, base_url: str, token: SecretStr | None, workloads: Sequence[str],
              timeout: float) -> dict[str, BackstopWord | str] | None:
    """Each workload's word, or why it cannot be read; None when the remediator did not answer at all."""
    url = f"{base_url.rstrip('/')}/api/v1/backstop"
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token is not None else {}
    try:
        async with session.get(url, params=[("workload", w) for w in workloads], headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                why = f"the remediator answered HTTP {response.status}"
                return dict.fromkeys(workloads, why)
            body = await read_upto(response, BODY_LIMIT + 1)
    except (TimeoutError, aiohttp.ClientError):
        return None
    if len(body) > BODY_LIMIT:
        return dict.fromkeys(workloads, "the answer is too large")
    try:
        answer = json.loads(body)
    except ValueError:
        return dict.fromkeys(workloads, "the answer is not JSON")
    return {w: word_in(answer, w) for w in workloads}


async def ask_once(store: StateStore, session: aiohttp.ClientSession, base_url: str, token: SecretStr | None,
                   settings: BackstopSettings, clock: Clock) -> None:
    """One ask for every watched target's workload, and what each record heard."""
    records = list(store)
    workloads = sorted({r.settings.effective_workload for r in records})
    answers: dict[str, BackstopWord | str] | None = None
    # The remediator takes at most ASK_LIMIT workloads an ask (a fleet exporter may watch more).
    for i in range(0, len(workloads), ASK_LIMIT):
        part = await ask(session, base_url, token, workloads[i:i + ASK_LIMIT], settings.timeout)
        if part is not None:
            answers = {**(answers or {}), **part}
    now = clock.mono()
    for record in records:
        before = record.backstop(now)
        record.take_answer(answers.get(record.settings.effective_workload) if answers is not None else None, now)
        after = record.backstop(now)
        if before is not None and after is not None and (before.mode, before.reason) != (after.mode, after.reason):
            log_event(log, "backstop " + after.mode, logging.WARNING if after.mode != "act" else logging.INFO,
                      target=record.name, reason=after.reason, detail=after.detail)


async def run(store: StateStore, session: aiohttp.ClientSession, base_url: str, token: SecretStr | None,
              settings: BackstopSettings, clock: Clock) -> None:
    """Ask every `settings.interval` until cancelled; a bug in one ask is logged and the next goes on."""
    while True:
        try:
            await ask_once(store, session, base_url, token, settings, clock)
        except Exception:
            log.exception("asking the remediator for the backstop's word failed unexpectedly")
        await asyncio.sleep(settings.interval)
