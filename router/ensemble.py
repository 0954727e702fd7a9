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
the blocks holding the ensemble's outputs are lent to the ingress with the final
response (``Loans``). A failed step fails the request with that step's error,
but only once every running step has answered: until then a worker may still be
reading the ingress's input block, which the ingress frees on the final response.

Conditional steps (a Conveyor extension, see ``ensemble_plan``): a step whose
``when`` does not hold is skipped, and so are the steps that need its outputs;
once ``exit_when`` holds no further step starts. The response then carries the
requested outputs that were made.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.conditions import Condition
from conveyor.router.ensemble_plan import Step
from conveyor.router.ensemble_state import EnsembleVersion
from conveyor.router.held_blocks import HeldBlocks
from conveyor.router.loans import Loans
from conveyor.router.stats import ModelStats
from conveyor.shm.regions import RegionCache

log = logging.getLogger(__name__)

Submit = Callable[[m.InferRequest, ModelStats], None]  # enqueue a step (answered on the self link)
CancelStep = Callable[[int], None]
Reply = Callable[[bytes, m.InferResponse], None]


def _renamed(ref: m.TensorRef, name: str) -> m.TensorRef:
    return m.TensorRef(name, ref.datatype, ref.shape, ref.region, ref.offset, ref.nbytes)


def _key(flag: m.Release) -> tuple[str, int]:
    return (flag.region, flag.offset)


@dataclass(eq=False)
class EnsembleRun:
    """One ensemble request in flight."""

    ingress: bytes
    request: m.InferRequest
    state: EnsembleVersion
    arrival_ns: int
    waiting: list[Step]
    wanted: dict[str, m.OutputSpec]  # requested ensemble outputs by name
    tensors: dict[str, m.TensorRef] = field(default_factory=dict)  # ensemble tensor -> where it lies
    blocks: dict[str, m.Release] = field(default_factory=dict)  # tensor -> the held block it lies in
    held: dict[tuple[str, int], m.Release] = field(default_factory=dict)  # blocks this run holds
    running: dict[int, tuple[Step, list[m.Release]]] = field(default_factory=dict)  # step id -> (step, holds)
    error: m.ErrorInfo | None = None
    exit_checked: bool = False  # exit_when was evaluated (it holds or not, for good)

    def needs(self, flag: m.Release) -> bool:
        """Whether a waiting step or the final response still reads the block ``flag`` frees."""
        key = _key(flag)
        lies_there = {t for t, b in self.blocks.items() if _key(b) == key}
        if lies_there & self.wanted.keys():
            return True
        return any(lies_there.intersection(s.reads()) for s in self.waiting)


class EnsembleScheduler:
    def __init__(
        self, submit: Submit, cancel: CancelStep, reply: Reply, holds: HeldBlocks, loans: Loans,
        generation: Callable[[], int], regions: RegionCache | None = None,
    ) -> None:
        self._submit = submit
        self._cancel = cancel
        self._reply = reply
        self._holds = holds
        self._loans = loans
        self._generation = generation
        self._regions = regions if regions is not None else RegionCache()  # to read condition tensors
        self._runs: dict[tuple[bytes, int], EnsembleRun] = {}
        self._steps: dict[int, EnsembleRun] = {}  # step request id -> its run
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._runs)

    def start(self, ingress: bytes, request: m.InferRequest, state: EnsembleVersion) -> None:
        assert state.plan is not None
        run = EnsembleRun(
            ingress, request, state, time.monotonic_ns(), list(state.plan.steps),
            {o.name: o for o in request.outputs},
        )
        run.tensors = {ref.name: ref for ref in request.inputs}
        self._runs[(ingress, request.id)] = run
        self._advance(run)

    def cancel(self, ingress: bytes, request_id: int) -> bool:
        """The client went away: stop the run (once its running steps answered)."""
        run = self._runs.get((ingress, request_id))
        if run is None:
            return False
        self._fail(run, m.ErrorInfo(int(Status.CANCELLED), "request cancelled by the client"))
        self._advance(run)
        return True

    def on_response(self, response: m.InferResponse) -> None:
        """A step's response, from the self link."""
        run = self._steps.pop(response.id, None)
        if run is None:
            for flag in response.release:
                self._holds.release(flag)
            return
        step, reads = run.running.pop(response.id)
        for flag in reads:
            self._holds.drop(flag)
        if response.error is not None:
            for flag in response.release:
                self._holds.release(flag)
            self._fail(run, response.error)
        else:
            self._take_outputs(run, step, response)
        self._advance(run)

    # --- internals ---------------------------------------------------------------------

    def _take_outputs(self, run: EnsembleRun, step: Step, response: m.InferResponse) -> None:
        for flag in response.release:
            self._holds.hold(flag)
            run.held[_key(flag)] = flag
        block = response.release[0] if response.release else None  # one block per response
        for ref in response.outputs:
            tensor = step.outputs.get(ref.name)
            if tensor is None:
                continue
            run.tensors[tensor] = _renamed(ref, tensor)
            if block is not None:
                run.blocks[tensor] = block

    def _advance(self, run: EnsembleRun) -> None:
        self._check_exit(run)
        if run.error is None:
            for step in [s for s in run.waiting if all(t in run.tensors for t in s.reads())]:
                run.waiting.remove(step)
                if step.when is None or self._condition_holds(run, step.when):
                    self._launch(run, step)
        else:
            run.waiting.clear()
        for key, flag in list(run.held.items()):
            if not run.needs(flag) or run.error is not None:
                del run.held[key]
                self._holds.drop(flag)
        if not run.running:
            self._finish(run)

    def _check_exit(self, run: EnsembleRun) -> None:
        exit_when = run.state.plan.exit_when if run.state.plan is not None else None
        if run.exit_checked or exit_when is None or exit_when.tensor not in run.tensors:
            return
        run.exit_checked = True
        if self._condition_holds(run, exit_when):
            run.waiting.clear()

    def _condition_holds(self, run: EnsembleRun, condition: Condition) -> bool:
        """Whether ``condition`` holds; False, failing the run, when it cannot be evaluated."""
        try:
            return condition.holds(run.tensors[condition.tensor], self._regions)
        except ConveyorError as exc:
            self._fail(run, m.ErrorInfo(int(exc.status), f"in ensemble '{run.state.model}', {exc.message}"))
            return False

    def _launch(self, run: EnsembleRun, step: Step) -> None:
        req = run.request
        inputs = [_renamed(run.tensors[t], name) for name, t in step.inputs.items()]
        reads = [run.blocks[t] for t in step.inputs.values() if t in run.blocks]
        for flag in reads:
            self._holds.hold(flag)
        outputs = []
        for name, tensor in step.outputs.items():
            spec = run.wanted.get(tensor)  # a client's placement or classification of an ensemble output
            outputs.append(m.OutputSpec(name) if spec is None else
                           m.OutputSpec(name, spec.classification, spec.region, spec.offset, spec.nbytes))
        step_id = next(self._ids)
        run.running[step_id] = (step, reads)
        self._steps[step_id] = run
        # flags=0: client regions were resolved for the ensemble request already (``regions``).
        self._submit(
            m.InferRequest(step_id, step.model, step.version, inputs, outputs, req.parameters, req.deadline_ns,
                           0, req.regions, req.request_id),
            run.state.stats,
        )

    def _fail(self, run: EnsembleRun, error: m.ErrorInfo) -> None:
        if run.error is None:
            run.error = error
            for step_id in list(run.running):
                self._cancel(step_id)

    def _finish(self, run: EnsembleRun) -> None:
        del self._runs[(run.ingress, run.request.id)]
        state = run.state
        conditional = state.plan is not None and state.plan.conditional
        if run.error is None and run.waiting and not conditional:  # with conditions: skipped
            step = run.waiting[0]
            missing = [t for t in step.inputs.values() if t not in run.tensors]
            run.error = m.ErrorInfo(int(Status.INTERNAL), (
                f"in ensemble '{state.model}', step {step.index} (model '{step.model}') cannot run: "
                f"no step produced tensor '{missing[0]}'"))
        response = self._response(run) if run.error is None else None
        for flag in run.held.values():
            self._holds.drop(flag)
        run.held.clear()
        duration = time.monotonic_ns() - run.arrival_ns
        if response is None:
            state.stats.fail.add(duration)
            error = run.error or m.ErrorInfo(int(Status.INTERNAL), "ensemble failed")
            response = m.InferResponse(run.request.id, state.model, state.label, error=error,
                                       generation=self._generation())
        else:
            req = run.request
            batched = state.config.max_batch_size > 0
            rows = req.inputs[0].shape[0] if batched and req.inputs and req.inputs[0].shape else 1
            state.stats.record_ensemble(rows, duration)
        self._reply(run.ingress, response)

    def _response(self, run: EnsembleRun) -> m.InferResponse | None:
        """The final response, its blocks lent to the ingress; None (and ``run.error``) if it cannot be made."""
        state = run.state
        missing = [t for t in run.wanted if t not in run.tensors]
        if missing and not (state.plan is not None and state.plan.conditional):
            run.error = m.ErrorInfo(int(Status.INTERNAL),
                                    f"in ensemble '{state.model}', no step produced output '{missing[0]}'")
            return None
        outputs = [run.tensors[t] for t in run.wanted if t in run.tensors]
        blocks = list({_key(run.blocks[t]): run.blocks[t] for t in run.wanted if t in run.blocks}.values())
        release: list[m.Release] = []
        if blocks:
            try:
                release = [self._loans.lend(blocks)]
            except ConveyorError as exc:
                run.error = m.ErrorInfo(int(exc.status), exc.message)
                return None
        return m.InferResponse(run.request.id, state.model, state.label, outputs, release=release,
                               generation=self._generation())
