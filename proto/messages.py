"""Internal descriptors exchanged over ZeroMQ between ingress, router and workers.

Every message is a msgspec ``Struct`` encoded as MessagePack (array-like, tagged),
one frame each; one ZeroMQ message carries the frames one loop turn produced for
a peer (``proto/framing.py``; the ROUTER sockets add an identity frame in front).
Tensor bytes never travel here: a ``TensorRef`` points into a shared-memory region.

Version: ``PROTOCOL_VERSION`` is carried by the ``*Hello`` messages; the router
refuses peers that speak another version. Fields are only ever appended, with
defaults, so a newer peer can read an older message.

Flows (see ARCHITECTURE.md)::

    ingress --InferRequest/ControlRequest/Cancel--> router
    router  --InferResponse/ControlReply/SettingsUpdate/RepositoryChanged--> ingress
    router  --LoadModel/UnloadModel/ExecBatch/Rehello/CancelItem/LeaveGranted--> worker
    worker  --WorkerHello/Heartbeat/ModelLoaded/BatchResult/ItemResponse/WorkerLeaving/CustomMetrics--> router
    worker  --InstanceClosed--> router (an unloaded instance's model closed)
    router  --LoraUpdate--> worker, worker --LoraUpdated--> router (runtime LoRA adapters)
    worker  --ItemResponsesSent--> router (a decoupled request's responses it sent straight to the ingress)
    worker  --InferRequest/Cancel--> router (as an ingress: BLS calls from models)
    worker  --InferResponse--> ingress (direct replies: ``BatchItem.reply_to``, decoupled ones too)
"""

from __future__ import annotations

from typing import Any

import msgspec

# 2: several descriptors per ZeroMQ message; workers answer an ingress directly.
# 3: a decoupled model's responses go straight to the ingress too (``ItemResponsesSent``).
# 4: ``RepositoryChanged`` to every ingress and BLS link.
# 5: runtime LoRA adapters (``LoraUpdate`` / ``LoraUpdated``).
# 6: ``InferRequest.prefix`` (a prompt's block hashes, for prefix-aware engine placement).
# 7: ``ErrorInfo.worker_lost`` (a request whose worker exited, which the OpenAI ingress may send again).
# 8: ``PrefixesEvicted`` (what a vLLM engine's cache evicted, from its KV-cache events), announced in
#    ``ModelLoaded.reports_evictions``.
# 9: ``InferRequest.session`` (a session key's hash, to keep a session's turns on one engine).
# 10: ``InstanceClosed`` (an unloaded instance's model closed: an instance update in place waits for it).
PROTOCOL_VERSION = 10


class TensorRef(msgspec.Struct, array_like=True, frozen=True):
    """A tensor living in shared memory: ``nbytes`` bytes at ``offset`` of ``region``.

    ``region`` is a POSIX shm name (server arena or client-registered segment).
    For BYTES tensors the bytes are the length-prefixed wire form.
    """

    name: str
    datatype: str
    shape: list[int]
    region: str
    offset: int
    nbytes: int


class OutputSpec(msgspec.Struct, array_like=True, frozen=True):
    """An output the client asked for; ``classification`` > 0 asks for top-k labels.

    A non-empty ``region`` asks the worker to write the output in place into a
    client-registered region (see ``ClientRegion``): ``nbytes`` bytes at ``offset``.
    """

    name: str
    classification: int = 0
    region: str = ""
    offset: int = 0
    nbytes: int = 0
    labels_path: str = ""  # classify with this label file (an ensemble's), not the answering model's own


# Client-registered regions appear in ``TensorRef.region``/``OutputSpec.region`` as
# ``CLIENT_REGION_PREFIX`` + the region's name (ingress to router) and as the prefix +
# the router's registration id (router to worker, with the ``ClientRegion`` in the batch).
CLIENT_REGION_PREFIX = "@"


class ClientRegion(msgspec.Struct, array_like=True, frozen=True):
    """A client's registered region, as a worker needs it to map the bytes.

    ``kind`` is "system" (``key`` names the POSIX segment) or "cuda" (``handle`` is
    the 64-byte cudaIpcMemHandle_t on ``device_id``). Offsets in refs are absolute
    within the segment; ``offset``/``byte_size`` bound the registered window.
    """

    id: int
    name: str
    kind: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    device_id: int = 0
    handle: bytes = b""


class Release(msgspec.Struct, array_like=True, frozen=True):
    """Where the consumer of a response writes one byte to hand the block back."""

    region: str
    offset: int


# --- ingress <-> router ------------------------------------------------------------


class IngressHello(msgspec.Struct, tag="ihello", array_like=True):
    """``reply_to``: the ingress's own PULL endpoint, where workers may send its
    responses directly ("" = every response comes through the router). ``ngh2_failed``: a gRPC
    ingress whose ngh2 engine failed its start-up self-test serves on h2 (counted for /metrics)."""

    version: int
    pid: int
    reply_to: str = ""
    ngh2_failed: bool = False


class TraceContext(msgspec.Struct, array_like=True, frozen=True):
    """What the ingress knows of a request the router may sample for a trace:
    when it was received (wall-clock ns) and the client's W3C ``traceparent``."""

    received_ns: int
    traceparent: str = ""


class InferRequest(msgspec.Struct, tag="infer", array_like=True):
    """One client request. ``id`` is unique per ingress connection.

    ``parameters`` carries the request-level KServe parameters (priority,
    timeout, sequence_id/start/end, ...) unchanged; ``deadline_ns`` is an
    absolute CLOCK_MONOTONIC time (0 = none); ``flags`` holds ``FLAG_*`` bits.
    """

    id: int
    model: str
    version: str
    inputs: list[TensorRef]
    outputs: list[OutputSpec]
    parameters: dict[str, Any] = {}
    deadline_ns: int = 0
    flags: int = 0
    regions: list[ClientRegion] = []  # filled by the router when refs name client regions
    request_id: str = ""  # the client's own id for the request (Triton's request_id())
    cache_key: bytes = b""  # response-cache models only: hash of the inputs and parameters (proto/request_hash.py)
    trace: TraceContext | None = None  # set by an ingress only while tracing is on (router/observability/tracing.py)
    # A prompt's chained block hashes (proto/prefix_keys.py), for models placed by prefix across their
    # engines (router/scheduling/engine_placement.py); [] for every other model.
    prefix: list[int] = []
    # The hash of the client's session key (``x-session-id``, OpenAI's ``prompt_cache_key``;
    # proto/prefix_keys.session_key), for the same models: its turns go to one engine; 0: none.
    session: int = 0


# ``InferRequest.flags`` bits.
FLAG_CLIENT_SHM = 1  # some input or output names a client-registered region


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    """The client went away: drop ``id`` if still queued."""

    id: int


class ControlRequest(msgspec.Struct, tag="ctl", array_like=True):
    """A metadata/lifecycle call: ``op`` names it (see router/control_ops.py)."""

    id: int
    op: str
    args: dict[str, Any] = {}


class ErrorInfo(msgspec.Struct, array_like=True, frozen=True):
    status: int
    message: str
    # The router failed the request because the worker running it exited: the request itself is not at
    # fault, and the OpenAI ingress may send it to another engine (proto/migration.py).
    worker_lost: bool = False


class InferResponse(msgspec.Struct, tag="resp", array_like=True):
    """The answer to ``InferRequest`` ``id``; ``final`` is False for all but the last
    response of a decoupled model. The consumer must write to every ``release``."""

    id: int
    model: str
    version: str
    outputs: list[TensorRef] = []
    error: ErrorInfo | None = None
    release: list[Release] = []
    final: bool = True
    parameters: dict[str, Any] = {}
    generation: int = 0  # the router's repository generation: a change voids ingress caches
    trace_id: int = 0  # sampled for a trace: the ingress answers with TraceEnd(trace_id, sent_ns)


class TraceEnd(msgspec.Struct, tag="tend", array_like=True):
    """Ingress to router: a traced request's answer is being sent to the client (wall-clock ns)."""

    trace_id: int
    sent_ns: int


class Refused(msgspec.Struct, tag="refused", array_like=True):
    """Ingress to router, fire and forget: a request to this model was refused before it
    was sent (unparsable, wrong input, shape or datatype). The router counts it as a
    failure (``reason="REJECTED"``) of the version that would have served it."""

    model: str
    version: str = ""


class SettingsUpdate(msgspec.Struct, tag="settings", array_like=True):
    """Router to every ingress and worker, on hello and on each change: the group's log
    settings (the logging extension), whether any tracing is on (ingress stamps requests),
    and whether the server is live (false once it failed to initialize: a repository root it
    cannot use, with --exit-on-error=false, as Triton's SERVER_FAILED_TO_INITIALIZE)."""

    log: dict[str, Any] = {}
    tracing: bool = False
    live: bool = True


class RepositoryChanged(msgspec.Struct, tag="repo", array_like=True):
    """Router to every ingress (and BLS link), in the loop turn in which the repository's
    generation changed (a model loaded, unloaded or reloaded): the signatures each keeps
    are void. Sent no later than a load's own reply, so that the client's next request is
    checked against the new model."""

    generation: int


class ControlReply(msgspec.Struct, tag="ctlr", array_like=True):
    id: int
    result: Any = None
    error: ErrorInfo | None = None


# --- router <-> worker -------------------------------------------------------------


class WorkerHello(msgspec.Struct, tag="whello", array_like=True):
    version: int
    pid: int
    host: str
    devices: list[str] = []
    slots: int = 1
    gpu_backends: list[str] = []  # backends that can run on ``devices`` (workers/devices.py gpu_backends)


class Heartbeat(msgspec.Struct, tag="hb", array_like=True):
    pass


class Rehello(msgspec.Struct, tag="rehello", array_like=True):
    """Router to worker: "I don't know you" (the router restarted): drop every
    instance and say hello again."""


class LoadModel(msgspec.Struct, tag="load", array_like=True):
    """Load one instance of ``model``/``version`` from ``path``; ``config`` is the
    serialized ModelConfig protobuf; ``instance`` names the slot on this worker."""

    model: str
    version: str
    path: str
    config: bytes
    instance: int
    device: str = "cpu"
    name: str = ""  # Triton's instance name (<group>_<index>), which models see; "" = <model>_0_<instance>


class UnloadModel(msgspec.Struct, tag="unload", array_like=True):
    model: str
    version: str
    instance: int


class ModelLoaded(msgspec.Struct, tag="loaded", array_like=True):
    model: str
    version: str
    instance: int
    error: str = ""
    user_ready: bool = False  # its model says whether it is ready (a Python model's is_ready()): ReadyCheck
    reports_evictions: bool = False  # its engine says what its cache evicts (PrefixesEvicted)


class InstanceClosed(msgspec.Struct, tag="closed", array_like=True):
    """Worker to router: an instance ``UnloadModel`` named is closed (a Python model's ``finalize`` returned)."""

    model: str
    version: str
    instance: int


class ReadyCheck(msgspec.Struct, tag="rcheck", array_like=True):
    """Router to worker: run the instance's own readiness check (a Python model's
    ``is_ready()``) and answer ``ReadyChecked`` with ``check``."""

    model: str
    version: str
    instance: int
    check: int


class ReadyChecked(msgspec.Struct, tag="rchecked", array_like=True):
    check: int
    ready: bool


class LoraUpdate(msgspec.Struct, tag="lora", array_like=True):
    """Router to worker: add the LoRA adapter ``name`` at ``path`` to the instance's engine
    (``path`` "": remove it), and answer ``LoraUpdated`` with ``check`` (0: nobody waits, an
    adapter given again to an instance that loaded after it was added)."""

    model: str
    version: str
    instance: int
    check: int
    name: str
    path: str = ""


class LoraUpdated(msgspec.Struct, tag="loraed", array_like=True):
    check: int
    error: ErrorInfo | None = None


class SequenceStep(msgspec.Struct, array_like=True):
    """A request's place in its sequence (sequence batching): the instance's
    ``slot`` that holds the sequence's implicit state, the START/END flags and
    the correlation id; the worker synthesizes the control inputs from it."""

    slot: int
    start: bool
    end: bool
    correlation_id: int | str


class BatchItem(msgspec.Struct, array_like=True):
    id: int
    inputs: list[TensorRef]
    outputs: list[OutputSpec]
    parameters: dict[str, Any] = {}
    request_id: str = ""
    sequence: SequenceStep | None = None  # set for models with sequence_batching
    traced: bool = False  # the router samples this request: the worker stamps the batch's compute
    # Non-empty: the worker sends this request's InferResponse straight to this ingress endpoint,
    # and the router, told by the BatchResult, only counts it (the latency path skips a hop).
    reply_to: str = ""


class ExecBatch(msgspec.Struct, tag="exec", array_like=True):
    """Run ``items`` as one batched call on ``instance`` of ``model``/``version``."""

    batch: int
    model: str
    version: str
    instance: int
    items: list[BatchItem]
    regions: list[ClientRegion] = []  # the client regions the items' refs name
    generation: int = 0  # the router's repository generation, for the direct replies
    # A direct sequence batch under --sequence-slot-padding: run as this many rows, a not-ready row in each
    # slot below it that has no item (Triton's null requests); 0: the items' rows.
    pad_to: int = 0


class ForgetRegions(msgspec.Struct, tag="forget", array_like=True):
    """Router to worker: these client registrations are gone; unmap them."""

    ids: list[int]


class ForgetSequences(msgspec.Struct, tag="forgetseq", array_like=True):
    """Router to worker: the sequences in these ``slots`` of an instance idled out;
    drop their implicit state."""

    model: str
    version: str
    instance: int
    slots: list[int]


class ItemResult(msgspec.Struct, array_like=True):
    id: int
    outputs: list[TensorRef] = []
    error: ErrorInfo | None = None
    release: list[Release] = []
    parameters: dict[str, Any] = {}  # the response's parameters (a Python model's InferenceResponse)
    # Not answered yet: a Python model's response sender answers it after execute returned, with an
    # ItemResponse (or straight to the ingress), as a decoupled model's request is answered.
    pending: bool = False


class BatchResult(msgspec.Struct, tag="result", array_like=True):
    """Per-item outputs plus the batch's timings in ns (for the statistics extension)."""

    batch: int
    items: list[ItemResult]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    error: ErrorInfo | None = None
    # Traced items only: wall-clock COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END.
    trace_ns: list[int] = []
    padded: int = 0  # not-ready rows the worker ran besides the items' (ExecBatch.pad_to)


class ItemResponse(msgspec.Struct, tag="iresp", array_like=True):
    """One response to item ``index`` of ``batch``, sent as a decoupled model produces
    it (during or after the batch's execute); ``final`` closes that request."""

    batch: int
    index: int
    outputs: list[TensorRef] = []
    error: ErrorInfo | None = None
    release: list[Release] = []
    final: bool = True
    parameters: dict[str, Any] = {}


class ResponseCount(msgspec.Struct, array_like=True):
    """What the router counts of one response a worker sent straight to the ingress:
    ``took_ns`` since the previous response (or since the batch reached the worker),
    ``output_ns`` of it spent writing the outputs, ``status`` 0 for a success (``failed``: an error
    response, whatever its status)."""

    took_ns: int
    output_ns: int = 0
    status: int = 0
    has_outputs: bool = True
    failed: bool = False  # an error response: its ``status`` may be UNKNOWN, which is 0 too


class ItemResponsesSent(msgspec.Struct, tag="isent", array_like=True):
    """Item ``index`` of ``batch`` (a decoupled model's request marked ``reply_to``) was
    answered by ``counts`` responses straight to its ingress since the last such note.
    The worker sends one after the first response and one with the final response
    (``final``, its ``error``), and in between at most every few hundred milliseconds:
    the statistics follow the stream while the tokens skip the router."""

    batch: int
    index: int
    counts: list[ResponseCount]
    final: bool = False
    error: ErrorInfo | None = None


class CustomMetric(msgspec.Struct, array_like=True):
    """One series of a model's custom metric (``pb_utils.MetricFamily``) in one worker:
    ``kind`` 0 counter, 1 gauge, 2 histogram; a histogram's sum is ``value`` and its
    per-bucket counts (not cumulative, the last one for +Inf) are ``counts``.
    ``removed``: the series is gone from that worker."""

    family: str
    description: str
    kind: int
    labels: dict[str, str]
    value: float = 0.0
    buckets: list[float] = []
    counts: list[int] = []
    removed: bool = False


# The series (a gauge, 0 to 1, labelled ``model`` and ``version``) on which a vLLM engine reports its
# KV-cache use, vLLM's own server's name for it; the router also reads it for a model's
# MAX_KV_CACHE_USAGE (router/scheduling/overload.py).
KV_USAGE_FAMILY = "vllm:kv_cache_usage_perc"


class CustomMetrics(msgspec.Struct, tag="cmetrics", array_like=True):
    """Worker to router: the custom-metric series that changed since the last one
    (everything, after a hello); the router serves them on ``/metrics``."""

    metrics: list[CustomMetric]


class PrefixesEvicted(msgspec.Struct, tag="evicted", array_like=True):
    """Worker to router: the engine of instance ``instance`` of ``model``/``version`` evicted the prompt
    blocks these prefix keys stand for (proto/prefix_keys.py; workers/backends/vllm/cached_prefixes.py);
    ``everything``: it holds nothing the router sent it before (its cache was cleared, or its events lost)."""

    model: str
    version: str
    instance: int
    keys: list[int] = []
    everything: bool = False


class CancelItem(msgspec.Struct, tag="icancel", array_like=True):
    """Router to worker: the client of item ``index`` of ``batch`` went away
    (a Python model sees it as ``request.is_cancelled()``)."""

    batch: int
    index: int


class WorkerLeaving(msgspec.Struct, tag="wleave", array_like=True):
    """Worker to router: this worker is stopping. Send it no new batch, move its
    instances to other workers, and answer ``LeaveGranted`` once none of its batches
    is running."""

    reason: str = ""


class LeaveGranted(msgspec.Struct, tag="wbye", array_like=True):
    """Router to worker: nothing of yours runs or will be sent: exit now."""


IngressToRouter = IngressHello | InferRequest | Cancel | ControlRequest | TraceEnd | Refused
RouterToIngress = InferResponse | ControlReply | SettingsUpdate | RepositoryChanged
RouterToWorker = (
    LoadModel | UnloadModel | ExecBatch | Heartbeat | Rehello | ForgetRegions | CancelItem | LeaveGranted
    | ForgetSequences | SettingsUpdate | ReadyCheck | LoraUpdate
)
WorkerToRouter = (
    WorkerHello | Heartbeat | ModelLoaded | BatchResult | ItemResponse | ItemResponsesSent | WorkerLeaving
    | CustomMetrics | ReadyChecked | LoraUpdated | PrefixesEvicted | InstanceClosed
)

encoder = msgspec.msgpack.Encoder()
encode = encoder.encode
ingress_decoder: msgspec.msgpack.Decoder[IngressToRouter] = msgspec.msgpack.Decoder(IngressToRouter)
router_reply_decoder: msgspec.msgpack.Decoder[RouterToIngress] = msgspec.msgpack.Decoder(RouterToIngress)
worker_decoder: msgspec.msgpack.Decoder[WorkerToRouter] = msgspec.msgpack.Decoder(WorkerToRouter)
worker_inbox_decoder: msgspec.msgpack.Decoder[RouterToWorker] = msgspec.msgpack.Decoder(RouterToWorker)
