"""The exporter app's typed keys, in a module of their own so that the app and its pages share them without importing each other."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from llm_vitals.exporter.clock import Clock
from llm_vitals.exporter.discovery.manager import Discovery
from llm_vitals.exporter.gpu_faults.node_watch import NodeCache, NodeWatchRunner
from llm_vitals.exporter.loop_lag import LoopLag
from llm_vitals.exporter.page import PageCache
from llm_vitals.exporter.poller import Poller
from llm_vitals.exporter.reload import ReloadState
from llm_vitals.exporter.settings import ExporterSettings
from llm_vitals.exporter.state import StateStore

SETTINGS = web.AppKey("settings", ExporterSettings)
STORE = web.AppKey("store", StateStore)
REGISTRY = web.AppKey("registry", CollectorRegistry)
CLOCK = web.AppKey("clock", Clock)  # monotonic for durations, wall for what is shown
SESSION = web.AppKey("session", aiohttp.ClientSession)
POLLER = web.AppKey("poller", Poller)
NODES = web.AppKey("nodes", NodeCache)
NODE_WATCH = web.AppKey("node_watch", NodeWatchRunner)  # started, stopped and re-ruled by the config
LAG = web.AppKey("loop_lag", LoopLag)  # the exporter's own event-loop lag
DISCOVERY = web.AppKey("discovery", Discovery)
RELOAD = web.AppKey("reload", ReloadState)
PAGES = web.AppKey("pages", PageCache)  # each target's /metrics lines, kept between scrapes
