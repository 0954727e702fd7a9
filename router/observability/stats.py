"""Per-model-version counters for the statistics extension (Triton's ModelStatistics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto.errors import Status

CANCELLED = int(Status.CANCELLED)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def wire(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchSizeStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ResponseStats:
    """Triton's InferResponseStatistics: the responses at one index of decoupled requests."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def wire(self) -> dict[str, dict[str, int]]:
        return {"compute_infer": self.compute_infer.wire(), "compute_output": self.compute_output.wire(),
                "success": self.success.wire(), "fail": self.fail.wire(),
                "empty_response": self.empty_response.wire(), "cancel": self.cancel.wire()}


@dataclass(slots=True)
class MemoryUsage:
    """One entry of Triton's ``memory_usage``: what loading the model took on one device."""

    kind: str  # "CPU", "CPU_PINNED" or "GPU"
    device: int
    byte_size: int

    def wire(self) -> dict[str, Any]:
        return {"type": self.kind, "id": self.device, "byte_size": self.byte_size}


@dataclass
class ModelStats:
    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchSizeStats] = field(default_factory=dict)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # Decoupled models: by response index within a request ("0", "1", ...), as Triton.
    responses: dict[int, ResponseStats] = field(default_factory=dict)
    memory: list[MemoryUsage] = field(default_factory=list)

    def record_response(
        self, index: int, took_ns: int, error_status: int | None, has_outputs: bool, output_ns: int = 0,
    ) -> None:
        """A decoupled request's response number ``index``, ``took_ns`` after the previous one
        (or after its execution started). Triton's classes: a success has outputs, an empty
        response is a bare final flag, a cancellation is a CANCELLED error, any other error fails.

        Triton's backend splits the time into infer and output (the tensor copy): a worker that
        answered the ingress itself measured ``output_ns`` (the copy into its arena); a response
        the router forwarded was seen whole, so it is all ``compute_infer``."""
        r = self.responses.get(index)
        if r is None:
            r = self.responses[index] = ResponseStats()
        if error_status == CANCELLED:
            r.cancel.add(took_ns)
            return
        r.compute_infer.add(took_ns - output_ns)
        if error_status is not None:
            if has_outputs:
                r.compute_output.add(output_ns)
            r.fail.add(took_ns)
        elif has_outputs:
            r.compute_output.add(output_ns)
            r.success.add(took_ns)
        else:
            r.empty_response.add(took_ns)

    def record_batch(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int,
                     padding: int = 0) -> None:
        """One execution of ``batch_size`` rows serving ``requests`` requests, ``padding`` of the rows not-ready
        ones (a padded sequence batch): as Triton's null requests, counted in the batch size, not as inferences.

        As in Triton, each request is charged the whole batch's compute times.
        """
        self.execution_count += 1
        self.inference_count += batch_size - padding
        self.last_inference_ms = time.time_ns() // 1_000_000
        # ``Duration.add`` inlined (six calls per batch on the router's hot path).
        d = self.compute_input
        d.count += requests
        d.ns += input_ns * requests
        d = self.compute_infer
        d.count += requests
        d.ns += infer_ns * requests
        d = self.compute_output
        d.count += requests
        d.ns += output_ns * requests
        b = self.batches.get(batch_size)
        if b is None:
            b = self.batches[batch_size] = BatchSizeStats()
        d = b.compute_input
        d.count += 1
        d.ns += input_ns
        d = b.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = b.compute_output
        d.count += 1
        d.ns += output_ns

    def record_composing(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """An ensemble step's batch ran: the ensemble counts its compute times too (once per request)."""
        self.compute_input.add(input_ns)
        self.compute_infer.add(infer_ns)
        self.compute_output.add(output_ns)

    def record_ensemble(self, rows: int, duration_ns: int, steps: EnsembleRequestStats | None = None) -> None:
        """An ensemble request succeeded (its steps were counted by their own models): one execution of its
        batch size, with its steps' compute times, as Triton's ensemble scheduler counts it."""
        self.success.add(duration_ns)
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        b = self.batches.get(max(1, rows))
        if b is None:
            b = self.batches[max(1, rows)] = BatchSizeStats()
        b.compute_input.add(steps.input_ns if steps is not None else 0)
        b.compute_infer.add(steps.infer_ns if steps is not None else 0)
        b.compute_output.add(steps.output_ns if steps is not None else 0)

    def record_cache_hit(self, lookup_ns: int, duration_ns: int) -> None:
        """A request answered from the response cache: a success with no execution, as in Triton."""
        self.cache_hit.add(lookup_ns)
        self.success.add(duration_ns)
        self.queue.add(0)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.wire(),
                "fail": self.fail.wire(),
                "queue": self.queue.wire(),
                "compute_input": self.compute_input.wire(),
                "compute_infer": self.compute_infer.wire(),
                "compute_output": self.compute_output.wire(),
                "cache_hit": self.cache_hit.wire(),
                "cache_miss": self.cache_miss.wire(),
            },
            "response_stats": {str(i): r.wire() for i, r in sorted(self.responses.items())},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.wire(),
                    "compute_infer": b.compute_infer.wire(),
                    "compute_output": b.compute_output.wire(),
                }
                for size, b in sorted(self.batches.items())
            ],
            "memory_usage": [u.wire() for u in self.memory],
        }


class EnsembleRequestStats:
    """One ensemble request's share of its ensemble's statistics: its steps' queue and compute times go to the
    ensemble's totals (``stats``), and their compute times are kept for the request's own batch statistics."""

    __slots__ = ("infer_ns", "input_ns", "output_ns", "queue", "stats")

    def __init__(self, stats: ModelStats) -> None:
        self.stats = stats
        self.queue = stats.queue  # a step's wait in its queue counts for the ensemble's
        self.input_ns = self.infer_ns = self.output_ns = 0

    def record_composing(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.stats.record_composing(input_ns, infer_ns, output_ns)
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns
