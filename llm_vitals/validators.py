"""Validators both configs share, so a target name, a listen address or a URL means the same to the exporter and the remediator.

Each raises ValueError with a message that never quotes more than the value it refuses (a URL
with a password in it is not quoted at all).
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, AnyHttpUrl, BeforeValidator

# A target name is the `target` label of every series and alert, and the remediator's key for it.
TARGET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
# A workload is what the operator owns and a restart does not replace (`Deployment/llm/vllm`,
# `LeaderWorkerSet/llm/big/0`, a name the config gives): a label value of `llm_vitals_target_info`
# and the remediator's key for budgets and circuits. Kubernetes names and kinds fit: a kind, a
# 63-character namespace and a 253-character name; any number of `/`.
WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/\[\]-]{0,511}$")
_LISTEN = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\s\[\]]*)):(?P<port>\d{1,5})$")


def target_name(name: str) -> str:
    """A target name, or ValueError: 1-63 of [A-Za-z0-9_.:-], starting with a letter or digit."""
    if not TARGET_NAME.match(name):
        raise ValueError(f"target name {name!r} must match {TARGET_NAME.pattern}")
    return name


def workload_name(name: str) -> str:
    """A workload name, or ValueError: 1-512 of [A-Za-z0-9_.:/[]-], starting with a letter or digit."""
    if not WORKLOAD_NAME.match(name):
        raise ValueError(f"workload {name[:100]!r} must match {WORKLOAD_NAME.pattern}")
    return name


def parse_listen(listen: str) -> tuple[str, int]:
    """`host:port`, `:port` or `[v6]:port` -> (host, port); an empty host is every address (0.0.0.0)."""
    match = _LISTEN.match(listen)
    if not match or not 0 <= int(match.group("port")) <= 65535:
        raise ValueError(f"listen must be HOST:PORT, got {listen!r}")
    host = match.group("v6") or match.group("host") or "0.0.0.0"
    return host, int(match.group("port"))


def listen_address(listen: str) -> str:
    """A listen address as written, once `parse_listen` accepts it."""
    parse_listen(listen)
    return listen


def http_url(url: str) -> str:
    """An absolute http:// or https:// URL with a host, or ValueError (the URL is not quoted: it may hold a password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a port that is not a number
    except ValueError:
        raise ValueError("must be an http:// or https:// URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ValueError("must be an http:// or https:// URL")
    return url


def _http_url_input(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError("must be an http:// or https:// URL")
    return http_url(value)


# The field types both configs use.
TargetName = Annotated[str, AfterValidator(target_name)]
WorkloadName = Annotated[str, AfterValidator(workload_name)]
ListenAddress = Annotated[str, AfterValidator(listen_address)]
HttpUrl = Annotated[str, AfterValidator(http_url)]
# The same rule, kept parsed, for code that needs the parts (the exporter shows a URL without its password).
ParsedHttpUrl = Annotated[AnyHttpUrl, BeforeValidator(_http_url_input)]
