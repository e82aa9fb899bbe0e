"""A small async client for the Kubernetes API: a kubeconfig or the in-cluster service account.

Only what the remediator uses: JSON requests with a bearer token (re-read from its file on each
request, since projected tokens rotate) or a client certificate, over TLS verified against the
cluster CA. A transport failure is `KubeUnavailable`; an HTTP status is the caller's to judge.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from .settings import KubernetesSettings


class KubeUnavailable(Exception):
    """The API server could not be reached or did not answer in time."""


class KubeConfigError(Exception):
    """The kubeconfig or the service account files cannot be used."""


@dataclass(frozen=True)
class Credentials:
    server: str
    tls: ssl.SSLContext
    token: str | None = None
    token_file: Path | None = None

    def bearer(self) -> str | None:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as exc:
                raise KubeConfigError(f"cannot read the token {self.token_file}: {exc.strerror}") from None
        return self.token


def _tls(ca_file: str | None, ca_data: str | None, insecure: bool) -> ssl.SSLContext:
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if ca_data:
        return ssl.create_default_context(cadata=base64.b64decode(ca_data).decode())
    return ssl.create_default_context(cafile=ca_file)


def _materialise(data: str | None, path: str | None, base: Path) -> str | None:
    """A kubeconfig file reference (relative to the kubeconfig) or its inline base64 data, as a path."""
    if path:
        return str((base / path).resolve())
    if data:
        with tempfile.NamedTemporaryFile(prefix="llm-vitals-kube-", delete=False) as handle:
            handle.write(base64.b64decode(data))
        return handle.name
    return None


def credentials_from_kubeconfig(path: Path) -> Credentials:
    """The current context of a kubeconfig: server, CA, and a token, token file or client cert."""
    try:
        doc = yaml.safe_load(path.read_text())
        context_name = doc["current-context"]
        context = next(c["context"] for c in doc["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        user = next((u.get("user") or {} for u in doc.get("users", []) if u["name"] == context.get("user")), {})
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration) as exc:
        raise KubeConfigError(f"cannot use the kubeconfig {path}: {type(exc).__name__}: {exc}") from None
    base = path.parent
    ca = _materialise(cluster.get("certificate-authority-data"), cluster.get("certificate-authority"), base)
    try:
        tls = _tls(ca, None, bool(cluster.get("insecure-skip-tls-verify")))
        cert = _materialise(user.get("client-certificate-data"), user.get("client-certificate"), base)
        key = _materialise(user.get("client-key-data"), user.get("client-key"), base)
        if cert and key:
            tls.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise KubeConfigError(f"cannot load the TLS files of {path}: {type(exc).__name__}: {exc}") from None
    token_file = user.get("tokenFile")
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        tls=tls,
        token=user.get("token"),
        token_file=(base / token_file) if token_file else None,
    )


def credentials_from(settings: KubernetesSettings) -> Credentials:
    """The kubeconfig when one is set, else the in-cluster service account."""
    if settings.kubeconfig is not None:
        return credentials_from_kubeconfig(settings.kubeconfig)
    try:
        tls = ssl.create_default_context(cafile=str(settings.ca_path))
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"cannot load the cluster CA {settings.ca_path}: {exc}") from None
    return Credentials(server=settings.api_url, tls=tls, token_file=settings.token_path)


class KubeClient:
    """JSON over one shared httpx client; `request` raises KubeUnavailable, never an httpx error."""

    def __init__(self, credentials: Credentials, timeout: float):
        self.credentials = credentials
        self.timeout = timeout
        self._client = httpx.AsyncClient(base_url=credentials.server, verify=credentials.tls, timeout=timeout)

    async def close(self) -> None:
        await self._client.aclose()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        headers = {"Accept": "application/json"}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            return await self._client.request(method, path, json=body, headers=headers, params=params)
        except httpx.TimeoutException:
            raise KubeUnavailable(f"{method} {path}: no answer within {self.timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise KubeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None


def message_of(response: httpx.Response) -> str:
    """The API server's `Status.message`, or the start of the body."""
    try:
        return str(response.json().get("message", ""))[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


def micro_time(unix: float) -> str:
    """A MicroTime: exactly six fractional digits (isoformat drops them when they are zero)."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
