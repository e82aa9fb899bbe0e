"""The client constructor: a kubeconfig or the in-cluster service account (a `KubeAccess`), to an ApiClient.

kubernetes-asyncio's kubeconfig loader reads the context, the cluster, the user and runs an exec
plugin (`users[].user.exec`, as EKS, GKE and AKS kubeconfigs use). What it leaves to us:

- **Credentials that change.** An exec plugin's credential is run again when it expires (the
  loader's own rule: 5 minutes before `expirationTimestamp`), and once after a 401 when it has no
  expiry (client-go's rule). A token file (`tokenFile`, the service account's projected token, which
  the kubelet rotates) is re-read for each request. `Credentials.before_request` does both.
- **Inline keys stay off the disk.** Python's `ssl` loads certificates from paths only. The
  `*-data` keys of a kubeconfig (CA, client certificate and key) are handed to it as anonymous
  in-memory files (Linux `memfd`) that are closed once the TLS context holds them; where there is
  no memfd, as 0600 files in a 0700 directory removed at once. Nothing is left in /tmp. (An exec
  plugin that prints a client certificate instead of a token is the one exception: the library
  writes it to a 0600 temp file of its own, removed at exit.)
- **One sentence per failure.** A config that cannot be used is a `KubeConfigError` naming the file
  or the service account, never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.kube_config import KubeConfigLoader

from llm_vitals.config import KubeAccess

from .errors import KubeConfigError

# The kubeconfig keys that carry key material inline, base64-encoded: (section, data key, path key).
_INLINE_KEYS = (
    ("cluster", "certificate-authority-data", "certificate-authority"),
    ("user", "client-certificate-data", "client-certificate"),
    ("user", "client-key-data", "client-key"),
)
# What the loader and the TLS setup raise for a config that cannot be used.
_CONFIG_ERRORS = (ConfigException, OSError, ValueError, KeyError, TypeError, AssertionError, AttributeError,
                  ssl.SSLError, yaml.YAMLError)


class Credentials:
    """The bearer token of a client: fixed (a kubeconfig token, a client certificate) unless a subclass renews it."""

    async def before_request(self, configuration: Configuration) -> None:
        """Make the token current before a request."""

    async def after_unauthorized(self, configuration: Configuration) -> bool:
        """After a 401: True when new credentials were fetched and the request is worth one more try."""
        return False


class TokenFile(Credentials):
    """A token re-read from its file for each request: projected service account tokens rotate."""

    def __init__(self, path: Path, what: str):
        self.path = path
        self.what = what

    async def before_request(self, configuration: Configuration) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError as exc:
            raise KubeConfigError(f"cannot read {self.what} {self.path}: {exc.strerror or exc}") from None
        if not token:
            raise KubeConfigError(f"{self.what} {self.path} is empty")
        configuration.api_key["BearerToken"] = f"Bearer {token}"


class ExecPlugin(Credentials):
    """A credential printed by an exec plugin: run again when it expires, or after a 401 when it gave no expiry."""

    def __init__(self, loader: KubeConfigLoader, where: str):
        self.loader = loader
        self.where = where
        self._lock = asyncio.Lock()

    async def before_request(self, configuration: Configuration) -> None:
        if hasattr(self.loader, "exec_plugin_expiry"):
            # The loader itself says whether it expired (5 minutes early), and runs the plugin if so.
            await self._run(configuration, force=False)

    async def after_unauthorized(self, configuration: Configuration) -> bool:
        await self._run(configuration, force=True)
        return True

    async def _run(self, configuration: Configuration, force: bool) -> None:
        async with self._lock:
            if force and hasattr(self.loader, "exec_plugin_expiry"):
                del self.loader.exec_plugin_expiry  # the loader skips the plugin while this is in the future
            try:
                await self.loader.load_from_exec_plugin()
            except Exception as exc:  # the plugin is foreign code: anything it does wrong is a config error
                raise KubeConfigError(f"the exec plugin of {self.where} failed: {type(exc).__name__}: {exc}"[:500]) from None
            configuration.api_key["BearerToken"] = self.loader.token


@contextlib.contextmanager
def _private_files(contents: Mapping[str, bytes]) -> Iterator[dict[str, str]]:
    """Each content as a path readable only while the block runs (a memfd; else a 0600 file, removed after)."""
    paths: dict[str, str] = {}
    descriptors: list[int] = []
    directory: str | None = None
    try:
        for key, data in contents.items():
            if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
                fd = os.memfd_create(f"llm-vitals-{key}")
                descriptors.append(fd)
                os.write(fd, data)
                paths[key] = f"/proc/self/fd/{fd}"
            else:
                directory = directory or tempfile.mkdtemp(prefix="llm-vitals-kube-")  # mode 0700
                path = os.path.join(directory, key)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                paths[key] = path
        yield paths
    finally:
        for fd in descriptors:
            os.close(fd)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _current(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The current context's cluster and user sections ({} for what cannot be found: the loader names it)."""
    found: dict[str, dict[str, Any]] = {"cluster": {}, "user": {}}
    try:
        context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
        found["cluster"] = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in doc.get("users") or [] if u["name"] == context.get("user"))
        if user is None:  # `user:` with nothing under it
            user = next(u for u in doc["users"] if u["name"] == context.get("user"))["user"] = {}
        found["user"] = user
    except (KeyError, TypeError, StopIteration):
        pass
    return found


def _without_inline_keys(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A copy of the kubeconfig whose current context's inline keys are taken out, and those keys decoded."""
    doc = copy.deepcopy(doc)
    sections = _current(doc)
    inline: dict[str, bytes] = {}
    for section, data_key, _ in _INLINE_KEYS:
        value = sections[section].pop(data_key, None) if isinstance(sections[section], dict) else None
        if value:
            try:
                inline[data_key] = base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"{data_key} is not base64") from None
    return doc, inline


def _read_kubeconfig(access: KubeAccess) -> tuple[dict[str, Any], Path]:
    assert access.kubeconfig is not None
    doc = yaml.safe_load(access.kubeconfig.read_text())
    if not isinstance(doc, dict):
        raise ValueError("not a kubeconfig (no mapping at the top)")
    return doc, access.kubeconfig.resolve().parent


async def _from_kubeconfig(access: KubeAccess) -> tuple[ApiClient, Credentials]:
    doc, base = _read_kubeconfig(access)
    doc, inline = _without_inline_keys(doc)
    user = _current(doc)["user"]
    with _private_files(inline) as paths:
        sections = _current(doc)
        for section, data_key, path_key in _INLINE_KEYS:
            if data_key in paths:
                sections[section][path_key] = paths[data_key]
        loader = KubeConfigLoader(config_dict=doc, config_base_path=str(base))
        configuration = Configuration()
        await loader.load_and_set(configuration)
        api = ApiClient(configuration)  # the TLS context reads the files here, and only here
    # The paths are gone: nothing may build another TLS context from this configuration.
    configuration.ssl_ca_cert = configuration.cert_file = configuration.key_file = None
    credentials: Credentials = Credentials()
    if isinstance(user, dict) and user.get("exec"):
        credentials = ExecPlugin(loader, access.describe())
    elif isinstance(user, dict) and user.get("tokenFile") and not user.get("token"):
        credentials = TokenFile(base / str(user["tokenFile"]), f"the token file of {access.describe()}")
    return api, credentials


def _in_cluster(access: KubeAccess) -> tuple[ApiClient, Credentials]:
    configuration = Configuration()
    configuration.host = access.api_url
    configuration.ssl_ca_cert = str(access.ca_path)
    try:
        api = ApiClient(configuration)
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"cannot load the cluster CA {access.ca_path}: {type(exc).__name__}: {exc}") from None
    return api, TokenFile(access.token_path, "the service account token")


async def open_api_client(access: KubeAccess) -> tuple[ApiClient, Credentials]:
    """A kubernetes-asyncio ApiClient and its credentials; KubeConfigError (one sentence) when they cannot be had."""
    if access.kubeconfig is None:
        return _in_cluster(access)
    try:
        return await _from_kubeconfig(access)
    except KubeConfigError:
        raise
    except _CONFIG_ERRORS as exc:
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise KubeConfigError(f"cannot use {access.describe()}: {type(exc).__name__}: {text}"[:500]) from None
