"""Where the Responses API's stored responses live (``responses.py``): ``store`` (default true, as OpenAI's)
keeps a response so that ``GET /v1/responses/{id}`` shows it and a later request's ``previous_response_id``
continues its conversation.

The ingress is stateless and a group may run several OpenAI ingress processes, restarted at any time: a
stored response must be found by every one of them, and survive each one's restart. So the store is not a
process's memory but a file every ingress process of the group opens: SQLite in WAL mode (readers never wait
for the writer; a write is one short transaction), by default in the group's run folder, which lives as long
as the group (``--responses-store`` puts it elsewhere, to outlive the group). ``ResponseStore`` is what the
ingress needs of a store, so that a store shared by several hosts (Redis, a database) can stand in for the file.

Every store is bounded, each bound a setting (``deploy/ingress_settings.py``): a count of responses, their bytes
and their age. A response older than the age is gone (an unknown id: OpenAI's 404); a new one past the count or
the bytes evicts the oldest first; a single response larger than the whole byte bound is not stored at all
(``put`` says so), since keeping it would evict everything else.

The SQLite calls run in a thread (``asyncio.to_thread``): a write waits for another process's write at most
``BUSY_TIMEOUT_MS``, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from conveyor.proto.errors import unavailable

log = logging.getLogger(__name__)

# How long a write waits for another ingress process's write to the same file: each is one short transaction,
# so a wait this long means a stuck writer, and the request fails rather than waits on.
BUSY_TIMEOUT_MS = 5000
STORE_FILE = "responses.sqlite3"  # in the group's run folder, unless --responses-store names a file
DEFAULT_MAX_COUNT = 10_000  # responses kept: each is a conversation a client may continue
DEFAULT_MAX_BYTES = 256 << 20  # their bytes (answers and conversations): a disk's share, not a memory's
DEFAULT_MAX_AGE_S = 30 * 24 * 3600  # OpenAI keeps a stored response 30 days


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_count: int = DEFAULT_MAX_COUNT
    max_bytes: int = DEFAULT_MAX_BYTES
    max_age_s: float = DEFAULT_MAX_AGE_S


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: its answer as ``GET`` shows it, the conversation a follow-up continues (the
    chat messages, JSON) and the conversation's session (its turns' engine)."""

    id: str
    created: float  # seconds since the epoch: its age
    response: bytes  # the response object, JSON
    conversation: bytes  # the chat messages up to and including its answer, JSON
    session: str

    @property
    def size(self) -> int:
        return len(self.response) + len(self.conversation) + len(self.session) + len(self.id)


class ResponseStore(Protocol):
    """What the ingress needs of a store of responses."""

    async def put(self, record: StoredResponse) -> bool:
        """Keep ``record``, evicting the oldest past the bounds; False: larger than the store, not kept."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None:
        """The record, or None: unknown, deleted, evicted or older than the age bound."""
        ...

    async def delete(self, response_id: str) -> bool:
        """Whether there was such a record (it is gone now)."""
        ...


class MemoryStore:
    """A process's own store: for an app without a file (tests, a single process that may forget)."""

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        self._records: dict[str, StoredResponse] = {}  # in insertion order: the oldest first

    async def put(self, record: StoredResponse) -> bool:
        limits = self._limits
        if record.size > limits.max_bytes:
            return False
        self._records.pop(record.id, None)
        self._records[record.id] = record
        total = sum(r.size for r in self._records.values())
        while len(self._records) > limits.max_count or total > limits.max_bytes:
            oldest = next(iter(self._records))
            total -= self._records.pop(oldest).size
        return True

    async def get(self, response_id: str) -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is None or record.created < time.time() - self._limits.max_age_s:
            return None
        return record

    async def delete(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None


# The records, and their count and bytes kept up to date by triggers: a write reads two numbers to know whether
# it must evict, rather than sum the table.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    response BLOB NOT NULL,
    conversation BLOB NOT NULL,
    session TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
CREATE TABLE IF NOT EXISTS totals (id INTEGER PRIMARY KEY CHECK (id = 0), count INTEGER NOT NULL,
                                   bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO totals VALUES (0, 0, 0);
CREATE TRIGGER IF NOT EXISTS responses_added AFTER INSERT ON responses BEGIN
    UPDATE totals SET count = count + 1, bytes = bytes + NEW.size WHERE id = 0;
END;
CREATE TRIGGER IF NOT EXISTS responses_removed AFTER DELETE ON responses BEGIN
    UPDATE totals SET count = count - 1, bytes = bytes - OLD.size WHERE id = 0;
END;
"""
EVICT_BATCH = 64  # the oldest records read at once while a write makes room: one, at the bounds, is the usual


def _evict(db: sqlite3.Connection, limits: StoreLimits) -> None:
    """The oldest records deleted until the rest are within the count and the bytes (in the caller's
    transaction)."""
    count, size = db.execute("SELECT count, bytes FROM totals").fetchone()
    while count > limits.max_count or size > limits.max_bytes:
        doomed = []
        for rid, each in db.execute("SELECT id, size FROM responses ORDER BY created, rowid LIMIT ?",
                                    (EVICT_BATCH,)):
            if count <= limits.max_count and size <= limits.max_bytes:
                break
            doomed.append((rid,))
            count, size = count - 1, size - each
        if not doomed:
            return
        db.executemany("DELETE FROM responses WHERE id = ?", doomed)


T = TypeVar("T")


async def _run(call: Callable[[Any], T], arg: Any) -> T:
    """``call(arg)`` in a thread; a file that cannot be read or written is the group's fault, said as a 503."""
    try:
        return await asyncio.to_thread(call, arg)
    except sqlite3.Error as exc:
        log.error("the responses store: %s", exc)
        raise unavailable(f"the stored responses cannot be reached: {exc}") from None


class SqliteStore:
    """The group's store: one SQLite file that every OpenAI ingress process of the group opens."""

    def __init__(self, path: str, limits: StoreLimits | None = None) -> None:
        self._path = path
        self._limits = limits or StoreLimits()
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used by one thread at a time

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:  # opened on first use: the app is built before the group's folder matters
            folder = os.path.dirname(self._path)
            if folder:
                os.makedirs(folder, exist_ok=True)
            db = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                 check_same_thread=False)
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.execute("PRAGMA journal_mode = WAL")  # readers do not wait for a writer, nor it for them
            db.execute("PRAGMA synchronous = NORMAL")  # WAL's: a power loss may lose the last writes, never the file
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def _put(self, record: StoredResponse) -> bool:
        limits = self._limits
        if record.size > limits.max_bytes:
            log.warning("response %s is not stored: %d bytes, over --responses-store-max-bytes %d", record.id,
                        record.size, limits.max_bytes)
            return False
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM responses WHERE created < ?", (time.time() - limits.max_age_s,))
                db.execute("DELETE FROM responses WHERE id = ?", (record.id,))
                db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                           (record.id, record.created, record.size, record.response, record.conversation,
                            record.session))
                _evict(db, limits)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return True

    def _get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._connection().execute(
                "SELECT id, created, response, conversation, session FROM responses WHERE id = ? AND created >= ?",
                (response_id, time.time() - self._limits.max_age_s)).fetchone()
        if row is None:
            return None
        return StoredResponse(row[0], row[1], bytes(row[2]), bytes(row[3]), row[4])

    def _delete(self, response_id: str) -> bool:
        with self._lock:
            cursor = self._connection().execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def totals(self) -> tuple[int, int]:
        """The records' count and bytes."""
        with self._lock:
            count, size = self._connection().execute("SELECT count, bytes FROM totals").fetchone()
        return int(count), int(size)

    async def put(self, record: StoredResponse) -> bool:
        return await _run(self._put, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await _run(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        return await _run(self._delete, response_id)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
