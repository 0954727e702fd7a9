"""Running ensemble requests: the router walks each request's DAG itself.

A step starts as soon as every tensor it reads exists; independent steps run at
the same time. Each step is an ordinary ``InferRequest`` to its composing model,
enqueued by the router under its own link's identity (``self_link.py``), so that
model's batching, instances and statistics apply; its response comes back on
that link and is matched to the run by the step's request id.

Tensors never move: a step's inputs are the ``TensorRef``s of the ensemble
request (the ingress arena, or a client region) or of earlier steps' outputs (a
worker arena), renamed to the composing model's input names. A step's output
block is held (``HeldBlocks``) while a step that reads it is waiting or running;
the blocks holding the ensemble's outputs are lent to the ingress with the
response (``Loans``). A failed step fails the request with that step's error,
and the final response waits until every running step has answered: until then
a worker may still be reading the ingress's input block, which the ingress frees
on the final response.

Decoupled steps (``ensemble_levels``): each response of one is a ``Branch`` of
its own in which the steps that read it run; the ensemble is decoupled itself.
Every branch that makes the ensemble's outputs answers the client with one
response (``final=False``) as soon as they exist, in the order the decoupled
step sent its responses; the final flag follows once every branch is done (on
the last response when that one completes the request). A failed step's error
is sent at once and the request ends when the running steps have answered.

Conditional steps (a Conveyor extension, see ``ensemble_plan``): a step whose
``when`` does not hold is skipped, and so are the steps that need its outputs;
once ``exit_when`` holds no further step starts (in that branch and the ones in
it). The response then carries the requested outputs that were made.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.ensembles.branch import Branch, block_key
from conveyor.router.ensembles.levels import REQUEST, Levels, build_levels
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.ensembles.step_limits import StepLimit
from conveyor.router.observability.stats import EnsembleRequestStats
from conveyor.router.response_cache import ResponseCache, cache_key
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.router.shared_memory.loans import Loans
from conveyor.router.spec.ensemble_conditions import Condition
from conveyor.router.spec.ensemble_plan import Step, unneeded_steps
from conveyor.shm.regions import RegionCache

log = logging.getLogger(__name__)

# A failed ensemble request counts this many failures (statistics and nv_inference_request_failure), as
# Triton's core counts it: once when it answers the error, once when the request's tracker ends.
ENSEMBLE_FAILURE_COUNTS = 2
# Requested-output sets whose unneeded steps an ensemble version remembers: a client asking for ever new subsets of
# many outputs cannot grow it without bound (past it, each such request works them out again).
MAX_OUTPUT_SETS = 64

Submit = Callable[[m.InferRequest, EnsembleRequestStats], None]  # enqueue a step (answered on the self link)
CancelStep = Callable[[int], None]
Reply = Callable[[bytes, m.InferResponse], None]


def sequence_parameters(request: dict[str, Any]) -> dict[str, Any]:
    """The sequence an ensemble's response belongs to, as Triton's ensemble scheduler adds it to every response:
    the request's ``sequence_id`` (0 without one) and its START and END flags."""
    sid = request.get("sequence_id", 0) if request else 0
    return {"sequence_id": sid if type(sid) is str else int(sid or 0),
            "sequence_start": request.get("sequence_start") is True if request else False,
            "sequence_end": request.get("sequence_end") is True if request else False}


def _renamed(ref: m.TensorRef, name: str) -> m.TensorRef:
    return m.TensorRef(name, ref.datatype, ref.shape, ref.region, ref.offset, ref.nbytes)


@dataclass(eq=False)
class StepInFlight:
    """A step on its way: where it runs and the blocks it reads (held until it answers)."""

    branch: Branch
    step: Step
    reads: list[m.Release]
    decoupled: bool


@dataclass(eq=False)
class EnsembleRun:
    """One ensemble request in flight."""

    ingress: bytes
    request: m.InferRequest
    state: EnsembleVersion
    levels: Levels
    arrival_ns: int
    root: Branch
    wanted: dict[str, m.OutputSpec]  # requested ensemble outputs by name
    running: dict[int, StepInFlight] = field(default_factory=dict)  # step request id -> the step
    steps: EnsembleRequestStats | None = None  # what its steps add to the ensemble's statistics
    open: set[Branch] = field(default_factory=set)  # branches not done, for the cleanup of a failure
    unsent: set[Branch] = field(default_factory=set)  # branches holding a response (and its loan)
    skip: frozenset[int] = frozenset()  # steps none of the requested outputs need: never run
    error: m.ErrorInfo | None = None
    error_sent: bool = False  # a streaming run told its client already; the final flag follows
    responded: bool = False  # its first response is sent (nv_inference_first_response_histogram_ms)
    cached: tuple[list[m.TensorRef], list[m.Release]] | None = None  # its response, for the response cache

    @property
    def conditional(self) -> bool:
        plan = self.state.plan
        return plan is not None and plan.conditional


class EnsembleScheduler:
    def __init__(
        self, submit: Submit, cancel: CancelStep, reply: Reply, holds: HeldBlocks, loans: Loans,
        generation: Callable[[], int], regions: RegionCache | None = None, cache: ResponseCache | None = None,
    ) -> None:
        self._submit = submit
        self._cancel = cancel
        self._reply = reply
        self._holds = holds
        self._loans = loans
        self._generation = generation
        self._regions = regions if regions is not None else RegionCache()  # to read condition tensors
        self._cache = cache  # --cache-config: a run whose request has a cache_key leaves its response there
        self._runs: dict[tuple[bytes, int], EnsembleRun] = {}
        self._steps: dict[int, EnsembleRun] = {}  # step request id -> its run
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._runs)

    def start(self, ingress: bytes, request: m.InferRequest, state: EnsembleVersion) -> None:
        assert state.plan is not None
        levels = state.levels or build_levels(state.plan)
        wanted = {o.name: o for o in request.outputs}
        # No outputs named is every output (Triton's rule): only a proper subset skips steps.
        skip = self._unneeded(state, wanted) if 0 < len(wanted) < len(state.plan.outputs) else frozenset()
        root = Branch(REQUEST, None, [s for s in levels.steps_at.get(REQUEST, ()) if s.index not in skip])
        root.tensors = {ref.name: ref for ref in request.inputs}
        root.absent = {name for name in state.optional_inputs if name not in root.tensors}
        run = EnsembleRun(ingress, request, state, levels, time.monotonic_ns(), root, wanted, open={root},
                          steps=EnsembleRequestStats(state.stats), skip=skip)
        self._runs[(ingress, request.id)] = run
        self._update(run, root, deep=False)

    @staticmethod
    def _unneeded(state: EnsembleVersion, wanted: dict[str, m.OutputSpec]) -> frozenset[int]:
        """The steps a request for only ``wanted`` skips (none where a step's condition decides what runs)."""
        plan = state.plan
        if plan is None or plan.conditional:
            return frozenset()
        key = frozenset(wanted)
        skip = state.unneeded.get(key)
        if skip is None:
            skip = unneeded_steps(plan, key)
            if len(state.unneeded) < MAX_OUTPUT_SETS:
                state.unneeded[key] = skip
        return skip

    def cancel(self, ingress: bytes, request_id: int) -> bool:
        """The client went away: stop the run (once its running steps answered)."""
        run = self._runs.get((ingress, request_id))
        if run is None:
            return False
        self._fail(run, m.ErrorInfo(int(Status.CANCELLED), "request cancelled by the client"))
        self._update(run, run.root, deep=False)
        return True

    def on_response(self, response: m.InferResponse) -> None:
        """A step's response, from the self link (a decoupled step sends several)."""
        run = self._steps.get(response.id)
        if run is None:
            self._release(response.release)
            return
        step = run.running[response.id]
        branch = step.branch
        if response.final or not step.decoupled:
            del self._steps[response.id], run.running[response.id]
            for flag in step.reads:
                self._holds.drop(flag)
            if step.decoupled:
                branch.running_streams -= 1
            else:
                branch.running_plain -= 1
            if run.state.step_limits:
                self._step_done(run.state.step_limits[step.step.index])
        deep = False
        if response.error is not None or run.error is not None:
            self._release(response.release)
            if response.error is not None:  # named, as Triton's FinishEnsemble names it, nested ones too
                error = response.error
                self._fail(run, m.ErrorInfo(error.status, f"in ensemble '{run.state.model}', {error.message}",
                                            error.worker_lost))
        elif not step.decoupled:
            self._hold(branch.take(response.outputs, step.step.outputs, response.release))
            deep = branch.level in run.levels.feeds_below  # a nested branch may wait for these
            if not response.final:  # its model was reloaded as a decoupled one while this ran
                self._cancel(response.id)
                self._fail(run, m.ErrorInfo(int(Status.INTERNAL), (
                    f"in ensemble '{run.state.model}', model '{step.step.model}' sent more than one response "
                    "to a step that is not decoupled")))
        elif response.outputs:
            child = self._nest(run, branch, step.step, response)
            self._update(run, child, deep=False)
        else:
            self._release(response.release)
        self._update(run, branch, deep)

    # --- the walk ----------------------------------------------------------------------

    def _update(self, run: EnsembleRun, branch: Branch, deep: bool) -> None:
        """Something happened in ``branch``: start what can start, close what is done (and the
        branches that closing lets close), answer the client, finish the run when it is over."""
        if (run.ingress, run.request.id) not in self._runs:
            return
        self._visit(run, branch, deep)
        while branch.closed and branch.parent is not None and run.error is None:
            branch = branch.parent
            self._visit(run, branch, deep=False)
        if run.root.closed or (run.error is not None and not run.running):
            self._finish(run)
        else:
            self._send_ready(run)

    def _visit(self, run: EnsembleRun, branch: Branch, deep: bool) -> None:
        if branch.closed or run.error is not None:
            return
        self._check_exit(run, branch)
        self._start_ready(run, branch)
        if deep:
            for child in list(branch.children):
                self._visit(run, child, deep=True)
        if run.error is not None:
            return
        self._release_unneeded(run, branch)
        levels = run.levels
        if (levels.streaming and branch.level == levels.response and not branch.answered
                and all(branch.has(t) for t in run.wanted)):
            self._answer(run, branch)  # at once: its other steps need not hold the response back
        if not branch.children and not branch.running_streams and self._settled(run, branch):
            self._close(run, branch)

    def _start_ready(self, run: EnsembleRun, branch: Branch) -> None:
        if branch.stopped:
            branch.waiting.clear()
            return
        for step in [s for s in branch.waiting if all(branch.has(t) for t in s.reads())]:
            branch.waiting.remove(step)
            if step.when is None or self._condition_holds(run, branch, step.when):
                self._launch(run, branch, step)
            if run.error is not None:
                return

    def _settled(self, run: EnsembleRun, branch: Branch) -> bool:
        """No tensor can come for the steps still waiting in ``branch`` (they will never run)."""
        if branch.running_plain:
            return False
        levels = run.levels
        if branch.level not in levels.fed_from_above:
            return True
        outer = branch.parent
        while outer is not None:  # only plain steps of the levels that feed nested ones matter
            if outer.running_plain and outer.level in levels.feeds_below:
                return False
            outer = outer.parent
        return True

    def _close(self, run: EnsembleRun, branch: Branch) -> None:
        if branch.waiting and not run.conditional:  # with conditions: skipped
            step = branch.waiting[0]
            missing = [t for t in step.inputs.values() if not branch.has(t)]
            self._fail(run, m.ErrorInfo(int(Status.INTERNAL), (
                f"in ensemble '{run.state.model}', step {step.index} (model '{step.model}') cannot run: "
                f"no step produced tensor '{missing[0]}'")))
            return
        branch.waiting.clear()
        if branch.level == run.levels.response and not branch.answered:
            self._answer(run, branch)
            if run.error is not None:
                return
        branch.closed = True
        branch.answered = True  # a branch that does not answer the client (a side branch) is done too
        self._drop_holds(run, branch)
        if branch.parent is not None:
            branch.parent.children.remove(branch)

    # --- steps -------------------------------------------------------------------------

    def _launch(self, run: EnsembleRun, branch: Branch, step: Step) -> None:
        req = run.request
        inputs: list[m.TensorRef] = []
        reads: list[m.Release] = []
        dims = run.state.batch_dims
        reshapes = dims.steps.get(step.index) if dims is not None else None
        for name, tensor in step.inputs.items():
            found = branch.find(tensor)
            if found is None:  # absent (Branch.absent): the step runs without it, as Triton's
                continue
            ref, block = found
            renamed = _renamed(ref, name)
            if reshapes is not None and name in reshapes:  # its model batches otherwise than the tensor
                renamed = reshapes[name].apply(renamed)
            inputs.append(renamed)
            if block is not None:
                reads.append(block)
        for flag in reads:
            self._holds.hold(flag)
        outputs = []
        for name, tensor in step.outputs.items():
            spec = run.wanted.get(tensor)  # a client's placement or classification of an ensemble output
            if spec is None:
                outputs.append(m.OutputSpec(name))
                continue
            # An enclosing ensemble's labels first: the outermost model answers the client.
            labels = (spec.labels_path or run.state.label_files.get(tensor, "")) if spec.classification else ""
            outputs.append(m.OutputSpec(name, spec.classification, spec.region, spec.offset, spec.nbytes, labels))
        step_id = next(self._ids)
        decoupled = step.index in run.levels.decoupled
        run.running[step_id] = StepInFlight(branch, step, reads, decoupled)
        if decoupled:
            branch.running_streams += 1
        else:
            branch.running_plain += 1
        self._steps[step_id] = run
        # flags=0: client regions were resolved for the ensemble request already (``regions``).
        request = m.InferRequest(step_id, step.model, step.version, inputs, outputs, req.parameters,
                                 req.deadline_ns, 0, req.regions, req.request_id)
        stats = run.steps or EnsembleRequestStats(run.state.stats)
        limits = run.state.step_limits
        if limits:  # max_inflight_requests: it runs when its step has a slot (it counts as running meanwhile)
            limit = limits[step.index]
            if limit.inflight >= limit.limit:
                limit.waiting.append((step_id, request, stats))
                return
            limit.inflight += 1
        self._submit(request, stats)

    def _step_done(self, limit: StepLimit) -> None:
        """A step's final response freed its slot: the next waiting step of a run still going takes it."""
        limit.inflight -= 1
        while limit.waiting and limit.inflight < limit.limit:
            step_id, request, stats = limit.waiting.popleft()
            if step_id in self._steps:
                limit.inflight += 1
                self._submit(request, stats)

    def _unqueue(self, run: EnsembleRun) -> None:
        """A failed run's steps still waiting for a slot never run: they are done now."""
        for limit in run.state.step_limits:
            for entry in [e for e in limit.waiting if e[0] in run.running]:
                limit.waiting.remove(entry)
                step = run.running.pop(entry[0])
                del self._steps[entry[0]]
                for flag in step.reads:
                    self._holds.drop(flag)
                if step.decoupled:
                    step.branch.running_streams -= 1
                else:
                    step.branch.running_plain -= 1

    def _nest(self, run: EnsembleRun, branch: Branch, step: Step, response: m.InferResponse) -> Branch:
        """One response of a decoupled step: a branch of its own for the steps that read it."""
        levels = run.levels
        level = step.index + 1
        child = Branch(level, branch, [s for s in levels.steps_at.get(level, ()) if s.index not in run.skip],
                       stopped=branch.stopped)
        self._hold(child.take(response.outputs, step.outputs, response.release))
        branch.children.append(child)
        if levels.encloses(level, levels.response):
            branch.queue.append(child)  # the client gets its responses in this order
        run.open.add(child)
        return child

    def _check_exit(self, run: EnsembleRun, branch: Branch) -> None:
        plan = run.state.plan
        exit_when = plan.exit_when if plan is not None else None
        if exit_when is None or branch.exit_checked or branch.stopped:
            return
        if run.levels.of_tensor.get(exit_when.tensor) != branch.level or not branch.has(exit_when.tensor):
            return
        branch.exit_checked = True
        if self._condition_holds(run, branch, exit_when):
            _stop(branch)

    def _condition_holds(self, run: EnsembleRun, branch: Branch, condition: Condition) -> bool:
        """Whether ``condition`` holds; False, failing the run, when it cannot be evaluated."""
        found = branch.find(condition.tensor)
        assert found is not None
        try:
            return condition.holds(found[0], self._regions)
        except ConveyorError as exc:
            self._fail(run, m.ErrorInfo(int(exc.status), f"in ensemble '{run.state.model}', {exc.message}"))
            return False

    def _fail(self, run: EnsembleRun, error: m.ErrorInfo) -> None:
        """Stop the run: ask its running steps to stop, give back every block no running step reads
        (those hold their own) and the responses not sent yet."""
        if run.error is not None:
            return
        run.error = error
        if run.state.step_limits:
            self._unqueue(run)
        for step_id in list(run.running):
            self._cancel(step_id)
        for branch in list(run.open):
            self._drop_holds(run, branch)
        for branch in run.unsent:
            if branch.response is not None:
                for loan in branch.response.release:
                    self._loans.take_back(loan)
                branch.response = None
        run.unsent.clear()

    # --- blocks --------------------------------------------------------------------------

    def _hold(self, flags: list[m.Release]) -> None:
        for flag in flags:
            self._holds.hold(flag)

    def _release(self, flags: list[m.Release]) -> None:
        for flag in flags:
            self._holds.release(flag)

    def _release_unneeded(self, run: EnsembleRun, branch: Branch) -> None:
        """Drop the blocks of ``branch`` that no waiting step, nested branch or response still reads."""
        if not branch.held:
            return
        needed = {t for s in branch.waiting for t in s.reads()}
        needed |= run.levels.kept.get(branch.level, frozenset())
        if branch.level == run.levels.response and not branch.answered:
            needed |= run.wanted.keys()
        for key, flag in list(branch.held.items()):
            if not branch.lying_in(flag) & needed:
                del branch.held[key]
                self._holds.drop(flag)

    def _drop_holds(self, run: EnsembleRun, branch: Branch) -> None:
        for flag in branch.held.values():
            self._holds.drop(flag)
        branch.held.clear()
        run.open.discard(branch)

    # --- answers -------------------------------------------------------------------------

    def _answer(self, run: EnsembleRun, branch: Branch) -> None:
        """Make ``branch``'s response, its blocks lent to the ingress; it leaves in its turn."""
        branch.answered = True
        state = run.state
        found = {t: branch.find(t) for t in run.wanted}
        for t, where in found.items():
            if where is None:  # Triton answers without it (a step may leave an output out)
                log.debug("Composing models did not output tensor %s", t)
        outputs = [where[0] for where in found.values() if where is not None]
        dims = state.batch_dims
        if dims is not None and dims.outputs:  # made by a step that batches otherwise than the ensemble
            outputs = [dims.outputs[ref.name].apply(ref) if ref.name in dims.outputs else ref for ref in outputs]
        blocks = {block_key(w[1]): w[1] for w in found.values() if w is not None and w[1] is not None}
        release: list[m.Release] = []
        if blocks:
            try:
                release = [self._loans.lend(list(blocks.values()))]
            except ConveyorError as exc:
                self._fail(run, m.ErrorInfo(int(exc.status), exc.message))
                return
        if run.request.cache_key and all(w is not None and w[1] is not None for w in found.values()):
            run.cached = (outputs, list(blocks.values()))  # not one of the client's own inputs passed through
        branch.response = m.InferResponse(run.request.id, state.model, state.label, outputs, release=release,
                                          final=False, generation=self._generation(),
                                          parameters=sequence_parameters(run.request.parameters))
        run.unsent.add(branch)

    def _ready(self, run: EnsembleRun) -> list[m.InferResponse]:
        """The responses whose turn has come, in the order the client gets them."""
        out: list[m.InferResponse] = []
        self._walk(run, run.root, out)
        return out

    def _walk(self, run: EnsembleRun, branch: Branch, out: list[m.InferResponse]) -> bool:
        """Collect ``branch``'s ready responses into ``out``; whether it will send no more."""
        if branch.level == run.levels.response:
            if branch.response is not None:
                out.append(branch.response)
                branch.response = None
                run.unsent.discard(branch)
            return branch.answered
        while branch.queue:
            if not self._walk(run, branch.queue[0], out):
                return False
            branch.queue.popleft()
        return branch.closed

    def _send_ready(self, run: EnsembleRun) -> None:
        """Send what a streaming run has ready (and a failure at once, the final flag later)."""
        if not run.levels.streaming:
            return
        if run.error is None:
            for response in self._ready(run):
                _first_response(run)
                self._reply(run.ingress, response)
        elif not run.error_sent:
            run.error_sent = True
            self._reply(run.ingress, m.InferResponse(run.request.id, run.state.model, run.state.label,
                                                     error=run.error, final=False, generation=self._generation()))

    def _finish(self, run: EnsembleRun) -> None:
        del self._runs[(run.ingress, run.request.id)]
        state = run.state
        if run.cached is not None and run.error is None and self._cache is not None:
            self._cache_response(run)  # before the run's holds go: the cache holds the blocks now
        for branch in list(run.open):
            self._drop_holds(run, branch)
        duration = time.monotonic_ns() - run.arrival_ns
        if run.error is None:
            responses = self._ready(run)
            last = responses.pop() if responses else m.InferResponse(
                run.request.id, state.model, state.label, generation=self._generation())
            last.final = True
            for response in responses:
                self._reply(run.ingress, response)
            req = run.request
            batched = state.config.max_batch_size > 0
            rows = req.inputs[0].shape[0] if batched and req.inputs and req.inputs[0].shape else 1
            state.stats.record_ensemble(rows, duration, run.steps)
            _first_response(run)
            self._reply(run.ingress, last)
            return
        # Triton's ensemble failures carry no reason of their own: OTHER, whatever its step's was. Counted as
        # replies.count_failure counts (which the ensembles may not import: it is a layer above them), and
        # twice, as Triton's core counts it (qa/L0_model_queue asserts it: an ensemble's failures "reflect
        # the failure counts of their composing models as well as the parent model").
        for _ in range(ENSEMBLE_FAILURE_COUNTS):
            state.stats.fail.add(duration)
            state.latency.failed("OTHER")
        error = None if run.error_sent else run.error
        self._reply(run.ingress, m.InferResponse(run.request.id, state.model, state.label, error=error,
                                                 generation=self._generation()))


    def _cache_response(self, run: EnsembleRun) -> None:
        """Triton's top-level ensemble cache: the response of a run that succeeded is inserted (the lookup
        counted the miss; the insertion adds to its time, as Triton counts both in it)."""
        assert self._cache is not None and run.cached is not None
        start = time.monotonic_ns()
        state = run.state
        self._cache.put(cache_key(state.model, state.label, run.request), *run.cached)
        state.stats.cache_miss.add(time.monotonic_ns() - start, 0)


def _first_response(run: EnsembleRun) -> None:
    """Count the run's first successful response in its time-to-first-response histogram (when kept)."""
    if not run.responded:
        run.responded = True
        first = run.state.latency.first_response
        if first is not None:
            first.observe(time.monotonic_ns() - run.arrival_ns)


def _stop(branch: Branch) -> None:
    """exit_when held: no further step starts in ``branch`` or in the branches nested in it."""
    branch.stopped = True
    branch.waiting.clear()
    for child in branch.children:
        _stop(child)
