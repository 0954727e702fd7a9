"""vLLM's ``AsyncLLM`` on an event loop of its own, on a thread of the worker process.

The engine core runs in a process vLLM starts (spawned, so the worker's threads and sockets are not
forked with it; it forks its model worker, ``model_workers.py``); this thread feeds it requests and turns
its outputs into responses, while the worker's main loop keeps serving.

vLLM's CPU build binds its model workers' compute threads to some cores and leaves the others to
the server around it. The worker then keeps all its threads, this one included, off those cores
(``avoid_cpus``): on the 2-vCPU reference host, with this thread free to land on the engine's core,
32 streaming clients got 1,400-2,500 tokens/s; kept off it, 2,900-4,200 (docs/PERFORMANCE.md).
On a small host the engine core process goes the other way, onto those cores (``placement.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from multiprocessing import connection
from typing import Any

from conveyor.deploy.runtime.dispatch_cpu import avoid_cpus, bound_cpus, confine, share_cpus
from conveyor.deploy.runtime.procs import mapped_shm, named_by_pid, unlink_shm
from conveyor.workers.backends.vllm.priority import descendants, lower_priority

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
# How long the engine's processes get to exit on SIGTERM before vLLM kills them (its default is 5 s). A CPU
# engine's model worker never exits on SIGTERM before that, so every unload, restart and stop waited 5 s,
# longer than the worker's own exit timeout; killed, nothing of the engine is lost (the worker unlinks the
# shared memory it leaves), and a GPU's memory goes with its process.
ENGINE_STOP_S = 1.0
VLLM_SHM_PREFIX = "psm_"  # Python's multiprocessing.shared_memory names, which vLLM's queues use
# How long the watch waits for a dead engine core's exit status once its sentinel fired (vLLM's own monitor
# may be reaping it at that moment): long enough for the kernel, short of holding the death's handling up.
EXIT_STATUS_WAIT_S = 1.0


START_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
# The start method the operator asked of vLLM, if any: then every process of the engine starts that way.
_OPERATORS_START_METHOD = os.environ.get(START_METHOD_ENV)

# The engines of this worker that start with an environment of their own (a GPU engine's
# CUDA_VISIBLE_DEVICES, which the engine core process inherits) start one at a time; the others at once.
_ENVIRONMENT = threading.Lock()


def _no_prometheus_logger() -> type:
    """A stand-in for the Prometheus logger vLLM gives every engine with statistics (it makes its own
    unless one is given). Its registry would live in this worker, where nothing serves it (the router's
    ``/metrics`` has the ``vllm:`` series from ``metrics.py``); recording into it was the costliest part
    of each engine step's statistics (docs/PERFORMANCE.md); and making it unregisters and registers
    the process's series, so two engines starting at once failed the second with DuplicateTimeseries."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class NoPrometheus(PrometheusStatLogger):
        def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
            pass

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

    return NoPrometheus


def engine_loggers(engine_args: dict[str, Any], stat_loggers: list[Any]) -> list[Any] | None:
    """The statistics loggers an engine starts with: ``stat_loggers`` and the Prometheus stand-in; none
    at all where the engine's statistics are off (vLLM turns them on for any logger it is given)."""
    if engine_args.get("disable_log_stats", False):
        return None
    return [*stat_loggers, _no_prometheus_logger()]


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where it is installed (vLLM's own server runs on it): the engine's output handler,
    its ZeroMQ socket's callbacks and every token's hand-off turn the loop several times a step, and
    asyncio's own loop does that in Python."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class EngineLoop:
    def __init__(self, name: str, engine_args: dict[str, Any], stat_loggers: list[Any], nice: int = 0,
                 on_compute_cores: bool = False, environment: dict[str, str] | None = None,
                 on_death: Callable[[str], None] | None = None) -> None:
        """``nice``: how much lower the CPU priority of the engine's processes is (``priority.py``);
        ``on_compute_cores``: keep the engine core process on the cores its model computes on
        (``placement.py``); ``environment``: set in this process for the engine to start with (its
        engine core process inherits it); ``on_death(why)``: called once, on a thread of its own, when the
        engine dies while it serves (``died``)."""
        # A forked engine process would inherit the worker's ZeroMQ sockets and threads.
        os.environ.setdefault(START_METHOD_ENV, "spawn")
        self.name = name
        self._on_death = on_death
        self._death = threading.Lock()
        self.death: str = ""  # why the engine died while serving ("" while it lives, and once closed)
        self._closing = False
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"vllm-{name}", daemon=True)
        self._thread.start()
        before = descendants()
        try:
            self.engine = self.run(self._start(engine_args, stat_loggers, environment or {})).result()
        except BaseException:
            self._stop_loop()
            raise
        # What the engine serves ("generate", or pooling tasks such as "embed"): each request is checked
        # against it, and refused with Triton's words (``embedding.task_refused``) rather than the engine's.
        self.supported_tasks: frozenset[str] = frozenset(self.run(self.engine.get_supported_tasks()).result())
        engine_pids, compute_pids = own_processes(self.engine, descendants() - before)
        self._engine_pids = engine_pids
        self._segments = mapped_shm(engine_pids, VLLM_SHM_PREFIX)  # while they live: the core may be killed
        if nice:
            threads = lower_priority(engine_pids, nice)
            log.info("the vLLM engine of '%s' runs at nice +%d (%d threads)", name, nice, threads)
        cores = bound_cpus(compute_pids)
        if cores and on_compute_cores:
            moved = confine(engine_pids, cores)
            log.info("the vLLM engine core of '%s' runs beside its model on CPU(s) %s (%d threads)",
                     name, ",".join(map(str, sorted(cores))), moved)
        self._avoided: set[int] | None = avoid_cpus(cores) if cores else None
        if self._avoided is not None:
            log.info("the vLLM engine of '%s' computes on CPU(s) %s: this worker's threads keep off them",
                     name, ",".join(map(str, sorted(cores))))
        self._watch_stop: int | None = None  # closed by ``close``: the watch ends
        self._cores = core_processes(self.engine)
        if self._cores:
            stop_rx, self._watch_stop = os.pipe()
            threading.Thread(target=self._watch, args=(self._cores, stop_rx), name=f"vllm-watch-{name}",
                             daemon=True).start()

    async def _start(self, engine_args: dict[str, Any], stat_loggers: list[Any],
                     environment: dict[str, str]) -> Any:
        from vllm import envs
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.executor.abstract import Executor
        from vllm.v1.executor.multiproc_executor import MultiprocExecutor

        loggers = engine_loggers(engine_args, stat_loggers)
        args = AsyncEngineArgs(**engine_args)
        with _ENVIRONMENT if environment else contextlib.nullcontext():
            os.environ.update(environment)
            # Another engine of this worker may have frozen vLLM's view of the environment: this one
            # starts with the environment as it is now.
            envs.disable_envs_cache()
            # AsyncLLM.from_engine_args, but for the executor class: an engine core of its own (not one run
            # in this threaded process) forks its model workers unless the operator chose a method, or the
            # engine runs on the CPU (model_workers.py: a forked CPU model worker is not bound to its cores).
            config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
            executor = Executor.get_class(config)
            if (executor is MultiprocExecutor and _OPERATORS_START_METHOD is None
                    and envs.VLLM_ENABLE_V1_MULTIPROCESSING and not current_platform.is_cpu()):
                from conveyor.workers.backends.vllm.model_workers import ForkedModelWorkers

                executor = ForkedModelWorkers
            engine = AsyncLLM(vllm_config=config, executor_class=executor, log_requests=args.enable_log_requests,
                              log_stats=not args.disable_log_stats, stat_loggers=loggers)
        # vLLM reads some settings from the environment per token (``envs.VLLM_COMPUTE_NANS_IN_LOGITS``
        # in each output's statistics): frozen once the engine is up, as vLLM does in its engine core.
        envs.enable_envs_cache()
        return engine

    def run(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run ``coro`` on the engine's loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    @property
    def errored(self) -> bool:
        """Whether the engine died (its core process gone): it will not answer again."""
        return bool(self.engine is not None and self.engine.errored)

    @property
    def dead(self) -> bool:
        """Whether the engine died while serving (its core process ended, or vLLM says so); not while it is being
        closed, when vLLM calls it errored too."""
        return bool(self.death) or (not self._closing and self.errored)

    def _watch(self, processes: list[Any], stop: int) -> None:
        """Wait for an engine core process to end, or for ``close``. An engine core that ends while the
        engine serves is its death, seen at once (vLLM's own flag is only read by the next request), with
        its cause: the signal that killed it, or its exit code."""
        sentinels = {p.sentinel: p for p in processes}
        ended = connection.wait([*sentinels, stop])
        os.close(stop)
        if self._closing:
            return
        if any(s in sentinels for s in ended):
            self.died("its engine core process ended")

    def died(self, why: str) -> None:
        """The engine cannot serve any more (its core process ended, or vLLM calls it dead): from any thread,
        once; nothing while the engine is being closed. On a thread of its own (it may wait, and ``on_death``
        may wait for this engine's loop): logged with its cause, and ``on_death`` told."""
        with self._death:
            if self.death or self._closing:
                return
            self.death = why
        threading.Thread(target=self._mourn, args=(why,), name=f"vllm-dead-{self.name}", daemon=True).start()

    def _mourn(self, why: str) -> None:
        """What ended the engine: an engine core process's end (the signal that killed it, or its exit code)
        rather than vLLM's word for it, which names no cause (``EngineCore encountered an issue``)."""
        cause = self._core_end()
        if cause:
            self.death = why = cause
        log.error("the vLLM engine of '%s' died: %s", self.name, why)
        if self._on_death is not None:
            self._on_death(why)

    def _core_end(self) -> str:
        """How the first engine core process that is no longer running ended ('' while all run). Its sentinel says
        it ended (``is_alive`` cannot: it says True to the thread that loses the race to reap it, vLLM's monitor
        being the other); its exit status may take a moment, while the winner records it."""
        for proc in self._cores:
            if not connection.wait([proc.sentinel], timeout=0):
                continue
            deadline = time.monotonic() + EXIT_STATUS_WAIT_S
            while proc.exitcode is None and time.monotonic() < deadline:
                time.sleep(0.01)
            return f"its engine core process (pid {proc.pid}) {exit_cause(proc.exitcode)}"
        return ""

    @property
    def dead_reason(self) -> str:
        error = getattr(self.engine, "dead_error", None)
        return f"{type(error).__name__}: {error}" if error is not None else "the engine is gone"

    @property
    def max_model_len(self) -> int:
        return int(self.engine.model_config.max_model_len)

    def close(self) -> None:
        """Abort what runs, stop the engine process, end the thread, unlink what the engine left in /dev/shm."""
        with self._death:
            self._closing = True  # the engine core's end from here on is no death
        if self._watch_stop is not None:
            os.close(self._watch_stop)
            self._watch_stop = None
        # vLLM's shared-memory queues (psm_*): its engine core leaves them behind, even on a clean shutdown.
        segments = self._segments | mapped_shm(self._engine_pids, VLLM_SHM_PREFIX)

        async def shutdown() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            shutdown = self.engine.shutdown
            if "timeout" in inspect.signature(shutdown).parameters:  # not in every vLLM
                shutdown(timeout=ENGINE_STOP_S)
            else:
                shutdown()
            self.engine = None  # not again from its __del__ at interpreter exit

        try:
            self.run(shutdown()).result(SHUTDOWN_TIMEOUT_S)
        except Exception:
            log.exception("the vLLM engine did not shut down cleanly")
        self._stop_loop()
        if self._avoided is not None:
            share_cpus(self._avoided)
            self._avoided = None
        left = unlink_shm(segments | named_by_pid(self._engine_pids))  # and what its killed processes named
        if left:
            log.info("unlinked %d shared-memory segment(s) the vLLM engine left: %s", len(left), ", ".join(left))

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(SHUTDOWN_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


def exit_cause(code: int | None) -> str:
    """A process's end in words: ``was killed by SIGILL``, ``exited with code 1``."""
    if code is None:
        return "ended (its exit status is unknown)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _manager_processes(engine: Any) -> list[Any]:
    """What vLLM's process manager started for ``engine``; none where vLLM runs in this process."""
    manager = getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", ()))


def core_processes(engine: Any) -> list[Any]:
    """The engine core processes to watch (``multiprocessing.Process``: each has a sentinel and an exit code);
    none where vLLM runs in this process or has another layout."""
    return [p for p in _manager_processes(engine) if getattr(p, "sentinel", None) is not None]


def own_processes(engine: Any, new: set[int]) -> tuple[set[int], set[int]]:
    """The processes of ``engine``, and those of them that run its model (where a CPU engine binds its
    compute threads): its engine core processes (vLLM's process manager knows them) and theirs. ``new``
    (what appeared below this worker while it started) holds them, but also another engine's that this
    worker started at the same time (two models loading at once), whose processes must not be re-niced,
    confined, or have their shared memory unlinked with this one's."""
    cores = {p.pid for p in _manager_processes(engine) if getattr(p, "pid", None)}
    if not cores:
        return new, new  # no engine core process of its own (vLLM run in this process), or another vLLM layout
    below = {pid for core in cores for pid in descendants(core)} & new
    return (cores & new) | below, below
