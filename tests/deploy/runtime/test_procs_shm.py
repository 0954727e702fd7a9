"""What a killed process leaves in /dev/shm, found by the processes: the segments they map, and the
semaphores named after them (joblib's loky, in vLLM's engine core), never another process's."""

from __future__ import annotations

import multiprocessing.shared_memory
import os
import subprocess
import sys
import uuid

from conveyor.deploy.runtime.procs import mapped_shm, named_by_pid, unlink_shm

LEVEL = "e2e"


def test_a_processs_segments_and_named_semaphores_are_found_and_unlinked() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    tag = uuid.uuid4().hex[:8]
    mine, theirs = f"sem.loky-{child.pid}-{tag}", f"sem.loky-{other.pid}-{tag}"
    segment = multiprocessing.shared_memory.SharedMemory(create=True, size=4096)
    try:
        for name in (mine, theirs):
            with open(f"/dev/shm/{name}", "wb") as f:
                f.write(b"\0" * 32)
        assert named_by_pid([child.pid]) == {mine}  # the other process's is not its
        assert named_by_pid([]) == set()
        assert segment.name in mapped_shm([os.getpid()], "psm_")  # mapped here, by its name
        assert unlink_shm([mine, "never-there"]) == [mine]
        assert named_by_pid([child.pid]) == set() and os.path.exists(f"/dev/shm/{theirs}")
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()
        unlink_shm([mine, theirs])
        segment.close()
        segment.unlink()
