"""Ports: the fixed defaults people can remember, or free ones when those are taken."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from llm_vitals.sim.engines.table import SIM_ENGINES

DEFAULTS = {"proxy": 8100, "backend": 8101, "control": 8104, "exporter": 9471, "remediator": 9472,
            "prometheus": 9473, "alertmanager": 9474}
BACKENDS = 3

# Every engine the simulator can be, but vLLM (the story's fleet): one server each, watched beside it.
MIXED_ENGINES = tuple(name for name in SIM_ENGINES if name != "vllm")


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _free_block(size: int, taken: set[int]) -> int:
    """The first of `size` consecutive free ports (the simulator puts backend i on base + i)."""
    for _ in range(200):
        base = free_port()
        block = range(base, base + size)
        if base + size < 65536 and not taken.intersection(block) and all(is_free(p) for p in block):
            return base
    raise RuntimeError(f"found no {size} consecutive free ports on 127.0.0.1")


@dataclass(frozen=True)
class Ports:
    proxy: int
    backend: int  # backend i listens on backend + i
    control: int
    exporter: int
    remediator: int
    prometheus: int
    alertmanager: int
    # One simulated server of each other engine (the mixed fleet): engine -> port, always free ones.
    engines: tuple[tuple[str, int], ...] = ()

    def backend_port(self, index: int) -> int:
        return self.backend + index


def choose_ports(prefer_defaults: bool = True) -> tuple[Ports, list[str]]:
    """The default ports where free, free ones elsewhere; also a note for each port that moved."""
    taken: set[int] = set()
    notes: list[str] = []
    chosen: dict[str, int] = {}
    block = range(DEFAULTS["backend"], DEFAULTS["backend"] + BACKENDS)
    if prefer_defaults and all(is_free(p) for p in block):
        chosen["backend"] = DEFAULTS["backend"]
    else:
        chosen["backend"] = _free_block(BACKENDS, taken)
        if prefer_defaults:
            notes.append(f"backend ports {block.start}-{block.stop - 1} busy: using {chosen['backend']}-{chosen['backend'] + BACKENDS - 1}")
    taken.update(range(chosen["backend"], chosen["backend"] + BACKENDS))
    for name, default in DEFAULTS.items():
        if name == "backend":
            continue
        if prefer_defaults and default not in taken and is_free(default):
            port = default
        else:
            port = free_port()
            while port in taken:
                port = free_port()
            if prefer_defaults:
                notes.append(f"{name} port {default} busy: using {port}")
        chosen[name] = port
        taken.add(port)
    engines = []
    for engine in MIXED_ENGINES:
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        engines.append((engine, port))
    return Ports(**chosen, engines=tuple(engines)), notes
