"""When the router takes a worker for dead (router/pool.py): on this host its
process decides, and silence only after much longer; a remote one by its silence; and the
router's own deafness is never the workers' silence."""

from __future__ import annotations

import os
import subprocess
import sys

from conveyor.router import pool as pool_module
from conveyor.router.pool import LOCAL_WORKER_TIMEOUT_S, WORKER_TIMEOUT_S, WorkerInfo, WorkerPool

LEVEL = "e2e"


def _pool(*workers: WorkerInfo) -> WorkerPool:
    pool = WorkerPool()
    for w in workers:
        pool.join(w)
    return pool


def test_a_live_local_worker_may_be_quiet_a_long_while() -> None:
    here = WorkerInfo(b"here", os.getpid(), pool_module._HOST, [], last_seen=0.0)
    pool = _pool(here)
    assert pool.silent(WORKER_TIMEOUT_S * 3) == []  # what dropped workers before: the router was busy
    assert pool.silent(LOCAL_WORKER_TIMEOUT_S + 1) == [here]  # alive but stuck that long: dropped


def test_a_local_worker_whose_process_is_gone_goes_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    gone = WorkerInfo(b"gone", proc.pid, pool_module._HOST, [], last_seen=100.0)
    assert _pool(gone).silent(100.0) == [gone]


def test_a_remote_worker_is_judged_by_its_silence() -> None:
    far = WorkerInfo(b"far", 1, "another-host", [], last_seen=0.0)
    pool = _pool(far)
    assert pool.silent(WORKER_TIMEOUT_S - 1) == []
    assert pool.silent(WORKER_TIMEOUT_S + 1) == [far]


def test_the_routers_own_deafness_is_excused() -> None:
    far = WorkerInfo(b"far", 1, "another-host", [], last_seen=0.0)
    pool = _pool(far)
    pool.excuse(12.0)  # the loop heard nothing for 12 s
    assert pool.silent(WORKER_TIMEOUT_S + 1) == []
    assert pool.silent(12.0 + WORKER_TIMEOUT_S + 1) == [far]
