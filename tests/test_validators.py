"""The validators both configs share: a target name, a listen address and a URL mean the same to the exporter and the remediator."""

from __future__ import annotations

import pytest

import llm_vitals.exporter.settings
import llm_vitals.remediator.settings
from llm_vitals.config import ConfigError
from llm_vitals.validators import http_url, parse_listen, target_name


@pytest.mark.parametrize(("listen", "parsed"), [
    ("127.0.0.1:9471", ("127.0.0.1", 9471)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
    (":9472", ("0.0.0.0", 9472)),
    ("[::1]:9471", ("::1", 9471)),
    ("localhost:65535", ("localhost", 65535)),
    ("9471", None), ("localhost", None), ("h:65536", None), ("::1:9471", None), ("h: 1", None), ("", None),
])
def test_parse_listen(listen: str, parsed: tuple[str, int] | None) -> None:
    if parsed is None:
        with pytest.raises(ValueError, match="listen must be HOST:PORT"):
            parse_listen(listen)
    else:
        assert parse_listen(listen) == parsed


@pytest.mark.parametrize(("name", "ok"), [
    ("gpu-a", True), ("a", True), ("pod.ns:8000", True), ("A_1", True), ("x" * 63, True),
    ("", False), ("-a", False), ("x" * 64, False), ("a b", False), ('a"b', False), ("a/b", False),
])
def test_target_name(name: str, ok: bool) -> None:
    if ok:
        assert target_name(name) == name
    else:
        with pytest.raises(ValueError, match="must match"):
            target_name(name)


@pytest.mark.parametrize(("url", "ok"), [
    ("http://127.0.0.1:8000", True), ("https://h/v1", True), ("http://u:p@h:1", True), ("http://[::1]:8000", True),
    ("ftp://h", False), ("http://", False), ("h:8000", False), ("http://h:port", False), ("http://h /x", False),
    ("", False),
])
def test_http_url(url: str, ok: bool) -> None:
    if ok:
        assert http_url(url) == url
    else:
        with pytest.raises(ValueError) as caught:
            http_url(url)
        assert str(caught.value) == "must be an http:// or https:// URL"  # never quoted: it may hold a password


def _exporter(listen: str, name: str, url: str) -> object:
    return llm_vitals.exporter.settings.parse_settings({"listen": listen, "targets": [{"name": name, "url": url}]}, "cfg.yaml", {})


def _remediator(listen: str, name: str, url: str) -> object:
    document = {"listen": listen, "auth": {"none": True}, "targets": {name: {"executor": "http", "url": url}}}
    return llm_vitals.remediator.settings.build_settings(document, {}, "cfg.yaml")


@pytest.mark.parametrize("load", [_exporter, _remediator], ids=["exporter", "remediator"])
@pytest.mark.parametrize(("listen", "name", "url", "problem"), [
    ("9471", "a", "http://h:1", "listen must be HOST:PORT, got '9471'"),
    ("127.0.0.1:1", "-a", "http://h:1", "target name '-a' must match"),
    ("127.0.0.1:1", "a", "ftp://h", "must be an http:// or https:// URL"),
])
def test_both_configs_refuse_the_same_values_with_the_same_words(load, listen, name, url, problem) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace("[", r"\[")):
        load(listen, name, url)
    load("127.0.0.1:1", "a", "http://h:1")
