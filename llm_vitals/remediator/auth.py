"""Caller authentication: what an Authorization header grants, `act` or `read` (or nothing).

- The act token (bearer, or basic auth) grants everything: the webhook, pause, circuit reset, node
  release, state re-initialisation, and every read.
- The read token (bearer, optional) grants reads only: the status, the journal, the pause,
  circuits and nodes. It is what the exporter's status page holds; it can never restart anything.
- `none: true` grants everything to anyone (an explicit choice).

Comparisons are constant-time (hmac.compare_digest), both tokens are always compared, and both
halves of a basic-auth pair are always compared, so timing says nothing about which was wrong.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Literal

from .settings import AuthSettings

Grant = Literal["act", "read"]


class Authenticator:
    def __init__(self, auth: AuthSettings):
        self.disabled = auth.none
        self._token = auth.bearer_token.get_secret_value().encode() if auth.bearer_token else None
        self._read = auth.read_token.get_secret_value().encode() if auth.read_token else None
        self._user = auth.basic_auth.username.encode() if auth.basic_auth else None
        self._password = auth.basic_password.get_secret_value().encode() if auth.basic_password else None
        self.scheme = "Bearer" if self._token is not None else "Basic"

    def grant(self, header: str | None) -> Grant | None:
        """What the Authorization header grants: `act`, `read`, or None."""
        if self.disabled:
            return "act"
        if not header:
            return None
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            offered = value.encode()
            acts = self._token is not None and hmac.compare_digest(offered, self._token)
            reads = self._read is not None and hmac.compare_digest(offered, self._read)
            return "act" if acts else "read" if reads else None
        if self._user is not None and self._password is not None and scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(value, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return None
            user_ok = hmac.compare_digest(user, self._user)
            password_ok = hmac.compare_digest(password, self._password)
            return "act" if bool(sep) and user_ok & password_ok else None
        return None

    def check(self, header: str | None) -> bool:
        """True when the header carries the act credentials (what the webhook takes)."""
        return self.grant(header) == "act"

    def allows(self, header: str | None, needs: Grant) -> bool:
        """True when the header grants what a route needs (`act` grants `read` too)."""
        granted = self.grant(header)
        return granted == "act" or (granted == "read" and needs == "read")
