"""One Lease as the API server keeps it, in memory: the transport under the remediator's `LeaseStore`
in the fleet soak (bench/soak.py) and in the Lease store's tests (tests/test_remediator_lease_store.py,
tests/test_remediator_state_lost.py).

It keeps the API server's rules that matter to the store: a write must carry the resourceVersion it
read (else `False`, a 409), and every answer is dated in whole seconds, as an HTTP `Date` header is.
What happens to the Lease from outside (another replica writing first, a newer replica's field, a
deletion, the API server away) is a switch or a method here, so that a test or the soak can make it.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

from llm_vitals.kube.client import Dated
from llm_vitals.kube.errors import KubeUnavailable
from llm_vitals.remediator.store.lease import STATE_ANNOTATION


class MemoryLeases:
    """One Lease as the API server keeps it: a write must carry the resourceVersion it read (else
    False, a 409), and every answer is dated in whole seconds (an HTTP Date)."""

    def __init__(self, clock: Callable[[], float], name: str = "llm-vitals-remediator"):
        self.clock = clock  # the API server's
        self.name = name  # the state's Lease; others of other names (the epoch's marker) are kept apart
        self.lease: dict[str, Any] | None = None
        self.others: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.meddle = False  # another replica writes first, between the next writer's read and its write
        self.down = False  # the API server cannot be reached: every read raises
        self.conflicts = 0
        self.lose_answers = 0  # the next writes are applied, and their answers lost (a timeout, a reset)

    def _date(self) -> float:
        return float(math.floor(self.clock()))

    async def get_lease(self, namespace: str, name: str) -> Dated[dict[str, Any] | None]:
        if self.down:
            raise KubeUnavailable("the API server cannot be reached: ConnectionRefusedError")
        if name != self.name:
            return Dated(copy.deepcopy(self.others.get(name)), self._date())
        return Dated(copy.deepcopy(self.lease), self._date())

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> Dated[bool]:
        if body["metadata"]["name"] != self.name:
            return self._other(body, create=True)
        if self.lease is not None:
            return Dated(False, None)
        return self._store(body)

    def _other(self, body: dict[str, Any], create: bool) -> Dated[bool]:
        """Another Lease beside the state's (the epoch's marker): the same resourceVersion rule."""
        name = body["metadata"]["name"]
        old = self.others.get(name)
        if (old is not None) if create else (old is None or body["metadata"].get("resourceVersion")
                                              != old["metadata"]["resourceVersion"]):
            return Dated(False, None)
        self.version += 1
        self.others[name] = copy.deepcopy(body)
        self.others[name]["metadata"]["resourceVersion"] = str(self.version)
        return Dated(True, self._date())

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> Dated[bool]:
        if name != self.name:
            return self._other(body, create=False)
        if self.meddle and self.lease is not None:
            self.meddle = False
            self._store(self.lease)  # the same state, written by another replica: a new resourceVersion
        if self.lease is None or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            self.conflicts += 1
            return Dated(False, None)
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> Dated[bool]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        if self.lose_answers > 0:
            self.lose_answers -= 1
            raise KubeUnavailable("the API server's answer was lost: ReadTimeout")
        return Dated(True, self._date())

    # -- what happens to it from outside ---------------------------------------------------------

    def delete(self, markers: bool = False) -> None:
        """The Lease is gone (deleted by hand): the shared state is lost. `markers`: the Leases beside it
        too (the namespace recreated)."""
        self.lease = None
        if markers:
            self.others.clear()

    def write_field(self, name: str, value: Any) -> bool:
        """A newer replica commits a field this version does not know; False when there is no Lease."""
        if self.lease is None:
            return False
        doc = json.loads(self.lease["metadata"]["annotations"][STATE_ANNOTATION])
        self.lease["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps({**doc, name: value}, sort_keys=True)
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return True

    def state_text(self) -> str | None:
        return None if self.lease is None else (self.lease["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
