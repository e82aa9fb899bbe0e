"""The durable journal: the audit log of every decision, restart, pause and circuit reset, in SQLite (WAL).

It records what happened (`GET /api/v1/actions` reads it); it is not the gate's state, which its
store keeps (`store.py`; one replica keeps it in a table of its own in this same file). All SQLite
work runs on one dedicated thread, off the event loop.

Durability: `record_intent` commits the restart row (result `pending`) before the caller starts
the executor, so the row is there for `finish`. After a crash, `open` marks leftover `pending`
rows `interrupted`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .gate import AlertFacts

T = TypeVar("T")
log = logging.getLogger("llm_vitals.remediator.journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    target TEXT,
    alertname TEXT,
    fingerprint TEXT,
    starts_at REAL,
    decision TEXT NOT NULL,      -- restart | refused | dry_run | resolved | circuit_reset | node_release | ...
    reason TEXT NOT NULL,
    executor TEXT,
    result TEXT,                 -- ok | error | timeout | pending | interrupted | NULL
    detail TEXT NOT NULL DEFAULT '',
    duration_seconds REAL,
    evidence TEXT,               -- JSON: the exporter's TARGET object when the decision was made
    pre_restart TEXT,            -- JSON: {argv, result, output, duration_seconds} of pre_restart
    evidence_from TEXT,          -- JSON: the URL of the exporter (shard) that reported the evidence
    workload TEXT                -- what the budget, the circuit and the ladder counted (docs/remediator.md)
);
CREATE INDEX IF NOT EXISTS actions_decision ON actions(decision, target, time);
CREATE INDEX IF NOT EXISTS actions_time ON actions(time);
-- The two tables below held the gate's state before its store did (`sqlite_store.py`): read once,
-- to start that store from a journal written by an older version; no longer written.
CREATE TABLE IF NOT EXISTS shared (   -- pause, storm marker, escalated nodes (single-replica mode)
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS circuits (
    target TEXT PRIMARY KEY,
    open INTEGER NOT NULL,
    opened_at REAL,
    reset_at REAL
);
"""

_COLUMNS = (
    "id", "time", "target", "alertname", "fingerprint", "starts_at", "decision",
    "reason", "executor", "result", "detail", "duration_seconds", "workload", "actor",
)
# Columns added after the first release, holding JSON: added to an older journal at open.
_ADDED_COLUMNS = {"evidence": "TEXT", "pre_restart": "TEXT", "evidence_from": "TEXT"}
# Columns added after the first release, holding text (and listed by `actions`).
# `actor`: who restarted the server the row is about (remediator/gate_word.py `restart_actor`), or NULL.
_ADDED_TEXT_COLUMNS = {"workload": "TEXT", "actor": "TEXT"}


class JournalBusy(Exception):
    """Another remediator holds this journal."""


class Journal:
    """The SQLite audit journal."""

    def __init__(self, path: Path | str, retention: float | None = None):
        self.path = Path(path)
        self.retention = retention
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._last_by_target: dict[str, float] = {}
        self._batch: list[tuple] = []
        self._flusher: asyncio.Task | None = None

    # -- lifetime -----------------------------------------------------------------------------

    async def open(self, now: float) -> int:
        """Open (creating) the database, mark interrupted restarts, prune old refusals. Returns #interrupted."""
        return await self._run(self._open_sync, now)

    async def close(self) -> None:
        await self.drain()
        if self._conn is not None:
            await self._run(self._close_sync)
        self._thread.shutdown(wait=True)

    def _open_sync(self, now: float) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Two remediators on one journal would each trust their own copy of the gate's state: refuse the second.
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalBusy(f"journal {self.path} is in use by another remediator") from None
        self._lock_fd = fd
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed intent survives a power cut too, not only a crash of this process.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        have = {row[1] for row in conn.execute("PRAGMA table_info(actions)")}
        for column, kind in (_ADDED_COLUMNS | _ADDED_TEXT_COLUMNS).items():
            if column not in have:
                conn.execute(f"ALTER TABLE actions ADD COLUMN {column} {kind}")
        self._conn = conn
        with self._tx():
            interrupted = conn.execute(
                "UPDATE actions SET result='interrupted', detail=? WHERE decision='restart' AND result='pending'",
                ("the remediator stopped while this restart ran; its outcome is unknown",),
            ).rowcount
            if self.retention is not None:
                # Restart rows are the history of what was done (and the last restart per target): never pruned.
                conn.execute(
                    "DELETE FROM actions WHERE decision IN ('refused', 'resolved', 'paused') AND time < ?",
                    (now - self.retention,),
                )
        self._last_by_target = dict(
            conn.execute("SELECT target, max(time) FROM actions WHERE decision='restart' GROUP BY target").fetchall()
        )
        return interrupted

    def _close_sync(self) -> None:
        assert self._conn is not None
        self._conn.close()
        self._conn = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- what it shows ------------------------------------------------------------------------

    @property
    def last_restart_by_target(self) -> dict[str, float]:
        """Start time of the last restart per target (any result), for the metrics."""
        return dict(self._last_by_target)

    # -- writes -------------------------------------------------------------------------------

    def record_decision(
        self,
        now: float,
        alert: AlertFacts,
        decision: str,
        reason: str,
        detail: str = "",
        executor: str | None = None,
        evidence: Mapping[str, Any] | None = None,
        evidence_from: str | None = None,
        workload: str | None = None,
        actor: str | None = None,
    ) -> None:
        """Journal a decision that runs nothing (refused, dry_run, resolved), without waiting for it.

        Group commit: decisions are queued and a background writer commits each batch in one
        transaction, so a storm of 500 duplicates costs a few commits and its answers never wait
        on the disk. Only the restart intent is awaited (`record_intent`). Readers (`actions`)
        wait for the queue to drain first, so the journal they see is never behind an answer.
        """
        self._batch.append((now, alert, decision, reason, detail, executor, None, _json(evidence),
                            _source(evidence, evidence_from), workload, actor))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_batches())

    async def drain(self) -> None:
        """Wait until every queued decision is committed (or has failed and been logged)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _flush_batches(self) -> None:
        while self._batch:
            batch, self._batch = self._batch, []
            try:
                await self._run(self._insert_many, batch)
            except Exception:
                # The answers went out already (200, decided); losing the record is logged loudly.
                log.exception("cannot journal %d decisions", len(batch))

    async def record_intent(
        self,
        now: float,
        alert: AlertFacts,
        executor: str,
        *,
        reason: str = "allowed",
        detail: str = "",
        evidence: Mapping[str, Any] | None = None,
        evidence_from: str | None = None,
        workload: str | None = None,
    ) -> int:
        """Commit the restart row (result `pending`) durably and return its id, for `finish`."""

        def write() -> int:
            with self._tx():
                return self._insert_row(now, alert, "restart", reason, detail, executor, "pending",
                                        _json(evidence), _source(evidence, evidence_from), workload, "remediator")

        action_id = await self._run(write)
        self._last_by_target[alert.target or ""] = now
        return action_id

    async def record_pause(self, now: float, until: float | None, reason: str) -> None:
        """A pause until `until` (None: the pause was lifted), as a `pause`/`unpause` row."""

        def write() -> None:
            with self._tx():
                word = "pause" if until is not None else "unpause"
                self._insert_row(now, AlertFacts("", {}, "", 0.0), word, word, reason, None, None)

        await self._run(write)

    async def record_pre_restart(self, action_id: int, record: Mapping[str, Any]) -> None:
        """Keep the output of the target's pre_restart command with its restart row."""

        def write() -> None:
            with self._tx():
                self._conn.execute(  # type: ignore[union-attr]
                    "UPDATE actions SET pre_restart=? WHERE id=?", (_json(record), action_id)
                )

        await self._run(write)

    async def finish(self, action_id: int, result: str, detail: str, duration: float) -> None:
        """Record the executor's outcome on its restart row."""

        def write() -> None:
            with self._tx():
                self._conn.execute(  # type: ignore[union-attr]
                    "UPDATE actions SET result=?, detail=?, duration_seconds=? WHERE id=?",
                    (result, detail, round(duration, 3), action_id),
                )

        await self._run(write)

    async def refuse_intent(self, action_id: int, reason: str, detail: str, duration: float) -> None:
        """The restart of row `action_id` was refused outright by the API server (nothing happened): the
        row becomes that refusal (decision `refused`, the reason, result null)."""

        def write() -> tuple[str | None, float | None]:
            with self._tx() as conn:
                conn.execute("UPDATE actions SET decision='refused', reason=?, result=NULL, detail=?, duration_seconds=?"
                             " WHERE id=?", (reason, detail, round(duration, 3), action_id))
                row = conn.execute("SELECT target FROM actions WHERE id=?", (action_id,)).fetchone()
                if row is None or row[0] is None:
                    return None, None
                (last,) = conn.execute("SELECT max(time) FROM actions WHERE decision='restart' AND target=?",
                                       (row[0],)).fetchone()
                return row[0], last

        target, last = await self._run(write)
        if target is not None:  # the last restart of the target is the one before, if any
            if last is None:
                self._last_by_target.pop(target, None)
            else:
                self._last_by_target[target] = last

    async def record_circuit_reset(self, workloads: list[str], now: float) -> None:
        """An operator closed the circuits of `workloads`: one `circuit_reset` row each (its workload
        in `target` and `workload`)."""

        def write() -> None:
            with self._tx():
                for workload in workloads:
                    self._insert_row(now, AlertFacts("", {"target": workload}, "", 0.0), "circuit_reset",
                                     "circuit_reset", "reset by an operator", None, None, workload=workload)

        await self._run(write)

    async def record_node_release(self, node: str, was_escalated: bool, now: float) -> None:
        """An operator released `node` (POST /api/v1/nodes/{node}/release): one `node_release` row."""
        detail = f"node {node} released by an operator" + ("" if was_escalated else " (it was not escalated)")

        def write() -> None:
            with self._tx():
                self._insert_row(now, AlertFacts("", {}, "", 0.0), "node_release", "node_release", detail, None, None)

        await self._run(write)

    async def record_workload_release(self, workload: str, was_paged: bool, now: float) -> None:
        """An operator released `workload` (POST /api/v1/workloads/release): one `workload_release` row."""
        detail = f"workload {workload} released by an operator" + ("" if was_paged else " (it was not paged)")

        def write() -> None:
            with self._tx():
                self._insert_row(now, AlertFacts("", {"target": workload}, "", 0.0), "workload_release",
                                 "workload_release", detail, None, None, workload=workload)

        await self._run(write)

    async def record_state_reinit(self, now: float, detail: str, discarded: Mapping[str, Any]) -> None:
        """A human re-initialised the shared state (POST /api/v1/state/reinit): one `state_reinit` row,
        with what it discarded as its evidence."""

        def write() -> None:
            with self._tx():
                self._insert_row(now, AlertFacts("", {}, "", 0.0), "state_reinit", "state_reinit", detail[:1000],
                                 None, None, evidence=_json(discarded))

        await self._run(write)

    # -- reads --------------------------------------------------------------------------------

    async def action(self, action_id: int) -> dict[str, Any] | None:
        """One journal row with its evidence and pre_restart output, or None."""
        await self.drain()
        columns = _COLUMNS + tuple(_ADDED_COLUMNS)

        def read() -> dict[str, Any] | None:
            row = self._conn.execute(  # type: ignore[union-attr]
                f"SELECT {', '.join(columns)} FROM actions WHERE id=?", (action_id,)
            ).fetchone()
            if row is None:
                return None
            found = dict(zip(columns, row, strict=True))
            for column in _ADDED_COLUMNS:
                found[column] = json.loads(found[column]) if found[column] else None
            return found

        return await self._run(read)

    async def actions(self, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` journal rows, newest first."""
        await self.drain()

        def read() -> list[dict[str, Any]]:
            rows = self._conn.execute(  # type: ignore[union-attr]
                f"SELECT {', '.join(_COLUMNS)} FROM actions ORDER BY time DESC, id DESC LIMIT ?", (limit,)
            ).fetchall()
            return [dict(zip(_COLUMNS, row, strict=True)) for row in rows]

        return await self._run(read)

    # -- plumbing -----------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _tx(self) -> _Transaction:
        assert self._conn is not None, "journal is not open"
        return _Transaction(self._conn)

    def _insert_many(self, rows: list[tuple]) -> list[int]:
        with self._tx():
            return [self._insert_row(*row) for row in rows]

    def _insert_row(
        self, now, alert: AlertFacts, decision, reason, detail, executor, result, evidence=None, evidence_from=None,
        workload=None, actor=None,
    ) -> int:
        cursor = self._conn.execute(  # type: ignore[union-attr]
            "INSERT INTO actions (time, target, alertname, fingerprint, starts_at, decision, reason, executor,"
            " result, detail, evidence, evidence_from, workload, actor)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                now,
                # Payload text: bounded, so a caller cannot bloat the journal.
                (alert.target or "")[:128] or None,
                alert.alertname[:128] or None,
                alert.fingerprint[:128] or None,
                alert.starts_at or None,
                decision,
                reason,
                executor,
                result,
                detail,
                evidence,
                evidence_from,
                (workload or "")[:300] or None,
                actor,
            ),
        )
        assert cursor.lastrowid is not None  # an INSERT always sets it
        return cursor.lastrowid


# The whole TARGET object is small (about 1 KB); a hostile exporter cannot bloat the journal past this.
_EVIDENCE_LIMIT = 64 * 1024


def _source(evidence: Mapping[str, Any] | None, url: str | None) -> str | None:
    """The exporter URL as the `evidence_from` column holds it (JSON), only beside some evidence."""
    return json.dumps(url) if evidence and url else None


def _json(value: Mapping[str, Any] | None) -> str | None:
    """A mapping as compact JSON for the journal, or None; an oversized one is kept cut and marked."""
    if not value:
        return None
    text = json.dumps(value, separators=(",", ":"), default=str)
    if len(text) > _EVIDENCE_LIMIT:
        return json.dumps({"truncated": True, "prefix": text[:_EVIDENCE_LIMIT]})
    return text


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error (the connection is in autocommit mode)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
