"""``ENABLE_WEIGHT_SHARING``: the instances of a TorchScript model that a worker
process runs on one device use one loaded module (one copy of the weights),
as in Triton's backend. Shared while any of them is loaded; a changed file is a
new module. Not for stateful models (Triton says the same): they would share state.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

Key = tuple[str, int, int, str]


class SharedModules:
    def __init__(self) -> None:
        # Held while loading, so two instance threads loading one model load it once.
        self._lock = threading.Lock()
        self._modules: dict[Key, tuple[Any, int]] = {}  # key -> (module, instances using it)

    @staticmethod
    def key(path: str, device: str) -> Key:
        try:
            st = os.stat(path)
        except OSError:  # loading it says why
            return (os.path.realpath(path), 0, 0, device)
        return (os.path.realpath(path), st.st_mtime_ns, st.st_size, device)

    def acquire(self, key: Key, load: Callable[[], Any]) -> Any:
        with self._lock:
            module, users = self._modules.get(key, (None, 0))
            if module is None:
                module = load()
            self._modules[key] = (module, users + 1)
            return module

    def release(self, key: Key) -> None:
        with self._lock:
            module, users = self._modules.pop(key, (None, 0))
            if users > 1:
                self._modules[key] = (module, users - 1)

    def __len__(self) -> int:
        return len(self._modules)


SHARED = SharedModules()  # this worker process's
