"""The gate's state for one replica: one versioned row in its SQLite file (`store.GateStore`).

The row (table `gate_state`: a version number and the state as `state_codec.to_json` writes it) lives in
the journal's file, in a table of its own beside the audit tables. This process is its only writer
(the journal's lock file refuses a second remediator), so `read` answers from memory and `commit`
compares versions in memory before it writes: a conflict only comes from another task of this
process (a restart ending, a pause) committing between a read and a commit. A commit is durable
(`synchronous=FULL`) before it returns: a restart's intent survives a crash and a power cut.

Opening:
- a row with a restart in progress was left by a remediator that stopped during that restart: the
  restart is over (the journal marks its row `interrupted`), and its start still counts against the
  cooldown and the budget;
- no row yet (a journal written before this store existed): the state is derived once from the
  journal's rows, as that version did at every start, and kept in the row from then on. Starting
  empty would forget the open circuits, the spent budgets, the cooldown, the pause and which alerts
  were decided: the first alert after an upgrade could restart a target whose circuit was open.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from .. import state_codec
from ..model import GateState, dedupe_key
from ..state import Pruning, Step, claim_lapsed, pruned, transition
from . import CONFLICT_RETRIES, Ambiguous, Conflicted, StateUnavailable, StoreHealth

T = TypeVar("T")

# One replica has no object size limit: it remembers decided alerts for a month (the Lease, a day).
LOCAL_KEY_MEMORY_SECONDS = 30 * 86400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gate_state (   -- the gate's state: one row, versioned (store/sqlite.py)
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL,
    state TEXT NOT NULL                   -- JSON, as remediator/state_codec.py's to_json writes it
);
"""


class SqliteStore:
    """The gate's state in one row of this replica's SQLite file, read from memory, committed durably."""

    last_is_current = True  # the only writer: memory is the committed state
    # This replica's claim ends when its restart does, or at its next start; one whose end could not be
    # written (a conflict with its other commits) at the next decision (state.orphan_ended).
    claims_expire = False

    def __init__(self, path: Path | str, budget_window: float, clock: Callable[[], float]):
        self.path = Path(path)
        self.pruning = Pruning(budget_window, key_memory=LOCAL_KEY_MEMORY_SECONDS, max_keys=None)
        self.clock = clock
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-state")
        self._conn: sqlite3.Connection | None = None
        self._state = GateState()
        self._version = 0
        # Fields a newer version wrote into the row (a downgrade): written back as they were.
        self._carried: dict[str, Any] = {}
        self._lock = asyncio.Lock()  # one commit at a time: compare, write, then remember
        self.health = StoreHealth()

    @property
    def last(self) -> GateState:
        return self._state

    def now(self) -> float:
        return self.clock()  # the only replica: its own clock is the one clock

    async def open(self) -> None:
        """Open the row (after the journal, which holds the file's lock); see the module docstring."""
        self._state, self._version = await self._run(self._open_sync, self.clock())

    async def close(self) -> None:
        if self._conn is not None:
            await self._run(self._conn.close)
            self._conn = None
        self._thread.shutdown(wait=True)

    async def read(self) -> tuple[GateState, int]:
        return self._state, self._version

    async def commit(self, version: int, state: GateState) -> bool:
        async with self._lock:
            if version != self._version:
                return False
            await self._written(self._pruned(state, self.clock()))
        return True

    async def transact(self, step: Step[T]) -> T:
        """The door (`store.GateStore.transact`): the state from memory and this replica's clock, the
        step, then the commit under the lock. A conflict is another task of this process committing
        while this one waited for the lock (its write in flight): read again, step again."""
        for _ in range(CONFLICT_RETRIES):
            state, version = await self.read()
            result, new = transition(step, state, self.clock(), self.pruning)
            if new is None:
                return result
            async with self._lock:
                if version == self._version:
                    try:
                        await self._written(new)
                    except StateUnavailable as exc:
                        # The write may have been applied with its answer lost: the caller must find out.
                        raise Ambiguous(str(exc), result) from None
                    return result
        raise Conflicted(f"the gate's state kept changing ({CONFLICT_RETRIES} conflicts)")

    async def _written(self, new: GateState) -> None:
        """Write `new` (pruned) as the next version, under the lock. Raises StateUnavailable."""
        try:
            await self._run(self._write, self._version, self._version + 1, self._text(new))
        except Exception as exc:
            self.health.failed("write", f"{type(exc).__name__}: {exc}")
            # A failed COMMIT may still have reached the file: memory follows the file again, or
            # every later commit would meet a version it does not know (GateLoop re-reads the intent).
            await self._reload()
            raise StateUnavailable(f"{self.path}: write the gate's state: {type(exc).__name__}: {exc}") from None
        self.health.ok()
        self._state, self._version = new, self._version + 1

    async def _reload(self) -> None:
        """Memory as the file holds it now (after a write whose outcome is unknown); kept when unreadable."""
        try:
            row = await self._run(self._row)
        except Exception as exc:
            self.health.failed("read", f"{type(exc).__name__}: {exc}")
            return
        if row is not None:
            try:
                self._state, self._version = state_codec.load(row[1]).state, int(row[0])
            except state_codec.BadState as exc:
                self.health.failed("read", str(exc))

    # -- on the database thread ------------------------------------------------------------------

    def _open_sync(self, now: float) -> tuple[GateState, int]:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        self._conn = conn
        row = conn.execute("SELECT version, state FROM gate_state WHERE id=1").fetchone()
        if row is None:
            state, version = state_from_journal(conn), 0
        else:
            try:
                stored, version = state_codec.load(row[1]), int(row[0])
            except state_codec.BadState as exc:
                raise state_codec.BadState(f"{self.path}: table gate_state: {exc}") from None
            state, self._carried = stored.state, dict(stored.carried)
        # A restart in progress here was this replica's own, and it stopped with it.
        opened = self._pruned(ended_claim(conn, state), now)
        if row is None or opened != state:
            self._write(version, version + 1, self._text(opened))
            version += 1
        return opened, version

    def _row(self) -> tuple[int, str] | None:
        assert self._conn is not None, "the gate's state is not open"
        return self._conn.execute("SELECT version, state FROM gate_state WHERE id=1").fetchone()

    def _write(self, version: int, new_version: int, text: str) -> None:
        conn = self._conn
        assert conn is not None, "the gate's state is not open"
        conn.execute("BEGIN IMMEDIATE")
        try:
            if version == 0:
                conn.execute("INSERT INTO gate_state (id, version, state) VALUES (1, ?, ?)", (new_version, text))
            else:
                changed = conn.execute("UPDATE gate_state SET version=?, state=? WHERE id=1 AND version=?",
                                       (new_version, text, version)).rowcount
                if changed != 1:  # another process wrote the row: the journal's lock should make this impossible
                    raise RuntimeError(f"{self.path}: the gate's state changed under this remediator")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _text(self, state: GateState) -> str:
        return state_codec.dump(state_codec.Stored(state, carried=self._carried))

    def _pruned(self, state: GateState, now: float) -> GateState:
        return pruned(state, now, self.pruning.budget_window, self.pruning.key_memory, self.pruning.max_keys)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)


def ended_claim(conn: sqlite3.Connection, state: GateState) -> GateState:
    """The state a start finds, with the restart its last process held over. The journal in the same
    file is the witness: a row for the claim's alert says the restart began (it is `interrupted` now,
    and its alert stays decided); no row says it never began (the process stopped, or the journal
    failed, between the commit and the row), and its alert is judged afresh at its next re-send
    instead of being a `duplicate` for a month. Its budget and cooldown stay spent either way."""
    if state.in_progress is None and state.in_progress_by is None:
        return state
    key = state.in_progress_key
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if key is not None and "actions" in tables and conn.execute(
        "SELECT 1 FROM actions WHERE decision='restart' AND fingerprint=? AND round(starts_at, 3)=? LIMIT 1", key
    ).fetchone() is not None:
        key = None
    return claim_lapsed(replace(state, in_progress_key=key))


def state_from_journal(conn: sqlite3.Connection, max_restarts: int | None = None,
                       budget_window: float | None = None) -> GateState:
    """The state as a journal's rows say it: what an older version rebuilt at each start, and what a
    human's re-initialisation `from: journal` starts the replicas' Lease from. Keyed by workload (the
    row's `workload`; a row written before workloads, by its target, a static target's workload):
    decided alerts, restarts since each circuit's reset, open circuits (the old `circuits` table, a
    `circuit_open` refusal since the reset, or `max_restarts` restarts within `budget_window`), pages
    not released, the pause, the storm and escalated nodes."""
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not {"actions", "circuits", "shared"} <= tables:
        return GateState()
    decided_at: dict[tuple[str, float], float] = {}
    for fingerprint, starts_at, at in conn.execute(
        "SELECT fingerprint, starts_at, time FROM actions"
        " WHERE decision IN ('restart','dry_run') AND fingerprint IS NOT NULL AND starts_at IS NOT NULL"
    ):
        key = dedupe_key(fingerprint, starts_at)
        decided_at[key] = max(at, decided_at.get(key, at))
    (last_started,) = conn.execute("SELECT max(time) FROM actions WHERE decision='restart'").fetchone()
    circuits = {t: (bool(o), r) for t, o, r in conn.execute("SELECT target, open, reset_at FROM circuits")}
    reset_at: dict[str, float] = {t: r for t, (_, r) in circuits.items() if r is not None}
    for workload, at in conn.execute(
        "SELECT coalesce(workload, target), max(time) FROM actions WHERE decision='circuit_reset' GROUP BY 1"
    ):
        reset_at[workload] = max(at, reset_at.get(workload, at))
    times: dict[str, list[float]] = {}
    for workload, started in conn.execute(
        "SELECT coalesce(workload, target), time FROM actions WHERE decision='restart' ORDER BY time"
    ):
        if workload is not None and started > reset_at.get(workload, -1.0):
            times.setdefault(workload, []).append(started)
    opened = {t for t, (is_open, _) in circuits.items() if is_open}
    for workload, at in conn.execute(
        "SELECT coalesce(workload, target), max(time) FROM actions WHERE reason='circuit_open' GROUP BY 1"
    ):
        if workload is not None and at > reset_at.get(workload, -1.0):
            opened.add(workload)
    if max_restarts is not None and budget_window is not None:
        opened |= {w for w, v in times.items() if spent(v, max_restarts, budget_window)}
    released: dict[str, float] = dict(conn.execute(
        "SELECT coalesce(workload, target), max(time) FROM actions WHERE decision='workload_release' GROUP BY 1"))
    pages = {w: at for w, at in conn.execute(
        "SELECT coalesce(workload, target), max(time) FROM actions WHERE reason='escalated_to_human' GROUP BY 1")
        if w is not None and at > released.get(w, -1.0)}
    kept = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM shared")}
    pause = kept.get("pause") or {}
    return GateState(
        decided_keys=frozenset(decided_at),
        decided_at=decided_at,
        last_restart_started=last_started,
        restart_times={t: tuple(v) for t, v in times.items()},
        open_circuits=frozenset(opened),
        paused_until=pause.get("until"),
        pause_reason=pause.get("reason", "") if pause.get("until") is not None else "",
        storm_seen_at=kept.get("storm_seen_at"),
        cordoned_nodes=frozenset(kept.get("gpu_nodes", ())),
        pages=pages,
    )


def spent(times: list[float], max_restarts: int, window: float) -> bool:
    """Whether `max_restarts` of `times` (sorted) ever fell within one `window`: the budget was spent
    and the circuit opened (it stays open until a reset, past the window)."""
    return any(times[i + max_restarts - 1] - times[i] < window for i in range(len(times) - max_restarts + 1))


def read_local_state(path: Path | str, max_restarts: int | None = None,
                     budget_window: float | None = None) -> GateState | None:
    """This replica's own state as its SQLite file holds it (the gate_state row, else what an older
    journal's rows say), or None when the file holds neither: what a first Lease, or a human's
    re-initialisation `from: journal`, starts from (switching from one replica to replicas keeps
    its open circuits, budgets, pause and cordoned nodes). Raises BadState on a row not ours."""
    path = Path(path)
    if not path.exists():
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "gate_state" in tables:
            row = conn.execute("SELECT state FROM gate_state WHERE id=1").fetchone()
            if row is not None:
                return state_codec.from_json(row[0])
        if {"actions", "circuits", "shared"} <= tables:
            return state_from_journal(conn, max_restarts, budget_window)
        return None
    finally:
        conn.close()
