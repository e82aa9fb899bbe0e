"""What can go wrong talking to the Kubernetes API server, and the one helper that reads an error answer.

Every caller sees one of three `KubeError`s, each with a sentence fit for a log line, an API answer
or the journal:

- `KubeConfigError`: the kubeconfig, the service account or an exec plugin cannot give credentials;
- `KubeUnavailable`: no answer (refused, reset, TLS; `KubeTimeout`: not in time);
- `ApiError`: the API server answered with an error status; `status`, `reason` (`Forbidden`,
  `Expired`, ...), `message` and the reasons of its `causes` come from its `Status` object
  (`api_error`). Callers decide by `status`, `reason` and `causes`, never by the message text.

No other module reads an API error body: they look at `ApiError.status` and show `str(error)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MESSAGE_LIMIT = 500  # characters of an error body kept: a Status message, or the start of an HTML page


class KubeError(Exception):
    """Anything that kept a request to the API server from succeeding."""


class KubeConfigError(KubeError):
    """The kubeconfig, the in-cluster service account or the exec plugin cannot be used."""


class KubeUnavailable(KubeError):
    """The API server could not be reached or did not answer in time."""


class KubeTimeout(KubeUnavailable):
    """The API server did not answer within the request's time limit."""


class ApiError(KubeError):
    """The API server answered with an error status (or a watch ERROR event)."""

    def __init__(self, status: int, reason: str = "", message: str = "", causes: tuple[str, ...] = ()):
        self.status = status
        self.reason = reason
        self.message = message
        # The `reason` of each of the Status's `details.causes` (an eviction's 429 names `DisruptionBudget`).
        self.causes = causes
        super().__init__(f"HTTP {status}: {message or reason or 'no message'}")


def api_error(status: int, body: bytes | str | Mapping[str, Any] | None) -> ApiError:
    """An error answer (its status and body, a `Status` object or anything else) as an ApiError.

    A watch ERROR event carries its own `code` (410 in a 200 stream): that code wins when present.
    """
    document: Any = body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            document = json.loads(body)
        except ValueError:
            return ApiError(status, "", " ".join(body.split())[:MESSAGE_LIMIT])
    if not isinstance(document, Mapping):
        return ApiError(status)
    code = document.get("code")
    message = str(document.get("message") or "")
    # A Status may say why in its causes too (an eviction's 429 names the PodDisruptionBudget there).
    details = document.get("details")
    causes = details.get("causes") if isinstance(details, Mapping) else None
    reasons: tuple[str, ...] = ()
    if isinstance(causes, list):
        said = [str(c.get("message")) for c in causes if isinstance(c, Mapping) and c.get("message")]
        message = " ".join([message, *said]).strip()
        reasons = tuple(str(c["reason"]) for c in causes if isinstance(c, Mapping) and c.get("reason"))
    return ApiError(code if isinstance(code, int) and code >= 400 else status, str(document.get("reason") or ""),
                    message[:MESSAGE_LIMIT], reasons)
