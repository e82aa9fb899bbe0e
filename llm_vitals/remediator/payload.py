"""The Alertmanager webhook payload, version "4" (see tests/fixtures/alertmanager/).

Unknown fields are ignored here, unlike in our config: Alertmanager has added fields to this
payload over its releases (`truncatedAlerts` came in 0.21), and a 4xx for a newer Alertmanager's
extra key would make it drop the alert for good.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Alert(_Lenient):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(min_length=1, max_length=128)

    @property
    def starts_at(self) -> float:
        return self.startsAt.timestamp()


class WebhookPayload(_Lenient):
    version: Literal["4"]
    groupKey: str = ""
    truncatedAlerts: int = Field(default=0, ge=0)
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""
    # A cap so that one payload cannot make us journal an unbounded number of rows.
    alerts: list[Alert] = Field(max_length=1000)


def describe_errors(exc: ValidationError) -> list[str]:
    """`alerts.0.startsAt: Input should be a valid datetime`: the field path first, no input values."""
    out = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(part) for part in error["loc"])
        out.append(f"{loc}: {error['msg']}" if loc else error["msg"])
    return out
