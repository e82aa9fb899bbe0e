"""The runbook's calls to the remediator carry its auth: the read token to read, the act token to act.

Every route but /healthz and /metrics needs a token (llm_vitals/remediator/app.py's `guard`); a
pasted command without one answers 401 in the middle of an incident, and the read token on a route
that acts answers 403.
"""

from __future__ import annotations

import re

from conftest import REPO

RUNBOOK = REPO / "docs" / "runbook.md"
OPEN_ROUTES = ("/healthz", "/metrics")


def remediator_calls(text: str) -> list[str]:
    """Each `curl` to $REMEDIATOR, continuation lines joined, from code blocks and inline code alike."""
    joined = re.sub(r"\\\n\s*", " ", text)
    calls = [m.group(0) for m in re.finditer(r"curl [^`\n|]*", joined)]
    return [c for c in calls if "$REMEDIATOR" in c and not any(c.split("$REMEDIATOR", 1)[1].startswith(r) for r in OPEN_ROUTES)]


def acts(call: str) -> bool:
    return re.search(r"-X ?(POST|DELETE|PUT|PATCH)\b", call) is not None


def test_the_runbook_defines_both_tokens_from_the_charts_secret() -> None:
    text = RUNBOOK.read_text()
    assert 'READ="Authorization: Bearer $(cat /etc/llm-vitals/tokens/read-token)"' in text
    assert 'ACT="Authorization: Bearer $(cat /etc/llm-vitals/tokens/webhook-token)"' in text


def test_every_runbook_call_to_the_remediator_carries_the_token_its_route_needs() -> None:
    calls = remediator_calls(RUNBOOK.read_text())
    assert len(calls) >= 10, calls  # the parse found the runbook's calls, not none
    wrong = [c for c in calls if ('-H "$ACT"' if acts(c) else '-H "$READ"') not in c]
    assert wrong == []
