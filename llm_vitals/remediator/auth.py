"""Caller authentication for the webhook and the circuit reset: bearer token or basic auth.

Comparisons are constant-time (hmac.compare_digest) and both halves of a basic-auth pair are
always compared, so timing says nothing about which half was wrong.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from .settings import AuthSettings


class Authenticator:
    def __init__(self, auth: AuthSettings):
        self.disabled = auth.none
        self._token = auth.bearer_token.get_secret_value().encode() if auth.bearer_token else None
        self._user = auth.basic_auth.username.encode() if auth.basic_auth else None
        self._password = auth.basic_password.get_secret_value().encode() if auth.basic_password else None
        self.scheme = "Bearer" if self._token is not None else "Basic"

    def check(self, header: str | None) -> bool:
        """True when the Authorization header carries the configured credentials."""
        if self.disabled:
            return True
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if self._token is not None:
            return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), self._token)
        if self._user is not None and self._password is not None and scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(value, validate=True).partition(b":")
            except (binascii.Error, ValueError):
                return False
            user_ok = hmac.compare_digest(user, self._user)
            password_ok = hmac.compare_digest(password, self._password)
            return bool(sep) and user_ok & password_ok
        return False
