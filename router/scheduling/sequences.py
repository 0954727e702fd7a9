"""Sequence batching (Triton's ``sequence_batching``) for one model version:
every request of a sequence runs on the instance its first request was bound
to, in the slot that holds the sequence's implicit state on that instance's
worker. The router owns the map sequence id -> (instance, slot), so it holds
whichever ingress process a request comes through.

As Triton's sequence batcher:

* A request names its sequence with ``sequence_id`` (an unsigned integer or a
  string) and flags its first and last requests with ``sequence_start`` and
  ``sequence_end``. START binds a new sequence to a free slot of a serving
  instance (the one with most free slots), or puts it in the backlog when every
  slot is taken; later requests queue behind it. A request that is not START
  for a sequence that is not open is refused.
* END closes the sequence to new requests at once (a later request with its id
  must START again); its slot frees when the END request leaves for the
  instance, and goes to the oldest sequence in the backlog.
* Batches form per instance, at most one request per sequence:
  ``direct``: the next request of every slot that has one (the shapes of the
  first), in slot order. Unlike Triton, empty slots are not padded with
  not-ready rows: state lives per slot in the worker, not in the rows, so the
  position of a row means nothing to any Conveyor backend and padding would
  only cost compute. ``--sequence-slot-padding`` pads them as Triton does
  (``padded_rows``: the worker runs a not-ready row in each empty slot below
  the highest one in use, and the statistics count those rows in the batch
  size, as Triton's). With ``max_queue_delay_microseconds`` and
  ``minimum_slot_utilization`` set, a batch waits for that share of slots.
  ``oldest``: the candidate sequences' next requests by age, formed like the
  dynamic batcher (preferred sizes, queue delay).
* A sequence waiting in the backlog expires at the earliest of its requests'
  ``timeout`` parameters (microseconds, from each one's arrival), as Triton's
  reaper expires a backlog queue: every request it holds fails UNAVAILABLE
  ("timeout of the corresponding sequence has been expired") and the sequence
  is gone (a later request of it must START again). Once it has a slot, the
  timeouts no longer apply.
* Cancelling a queued request cancels its whole sequence, as Triton's: its
  other queued requests fail CANCELLED too, the sequence ends and its slot
  frees (``remove_sequence``).
* A sequence with nothing queued for ``max_sequence_idle_microseconds`` since
  its last request arrived or was sent to the instance is ended: its slot
  frees and the worker is told to drop its state.
* When an instance stops serving (its worker exited or restarted) its sequences
  are lost: their queued requests fail UNAVAILABLE, and a later request of one
  of them that is not START is told so, until the sequence starts again or
  idles out. Other sequences are not affected.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, invalid_arg, unavailable
from conveyor.proto.sequence_config import SequenceConfig
from conveyor.router.pending import Pending
from conveyor.router.scheduling.priority_queues import DEADLINE_PASSED, Expired
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP

if TYPE_CHECKING:
    from conveyor.router.models import Instance

log = logging.getLogger(__name__)

SequenceId = int | str

# What the requests of a backlog sequence whose timeout passed are answered with (Triton's words and status).
SEQUENCE_TIMEOUT = ConveyorError(Status.UNAVAILABLE, "timeout of the corresponding sequence has been expired")


@dataclass(slots=True, eq=False)
class Sequence:
    id: SequenceId
    last_ns: int  # when its latest request arrived or left for the instance: the idle clock
    queue: deque[Pending] = field(default_factory=deque)
    waiting: bool = False  # in the backlog: its requests' ``timeout`` parameters apply
    expires_ns: int = 0  # while waiting: the earliest of its requests' timeouts (absolute); 0 = never


@dataclass(slots=True, eq=False)
class InstanceSlots:
    """One serving instance's slots: which sequence each holds."""

    instance: Instance
    worker: bytes | None  # the worker holding the slots' state; another one means it was lost
    bound: list[Sequence | None]
    free: list[int]  # a heap: the lowest free slot is used first
    released: list[int] = field(default_factory=list)  # idled out: the worker must drop their state
    # Removed by an instance update while it held sequences: it takes no new one and leaves once they end.
    closing: bool = False


class SequenceBatcher:
    adaptive: None = None  # adaptive batching is for dynamic batching only
    # Triton's test hooks (``delay_hooks.py``): no batch until this many requests are queued in the slots
    # and (``backlog_held_until``) this many in the backlog, once; 0 from then on, and in every deployment.
    held_until = 0
    backlog_held_until = 0

    def __init__(self, model: str, config: SequenceConfig, queue_cap: int = DEFAULT_QUEUE_CAP,
                 slot_padding: bool = False) -> None:
        self.model = model
        self.config = config
        # --sequence-slot-padding: a direct batch of a batching model runs every slot up to its highest one.
        self.pads = slot_padding and not config.oldest and config.max_batch_size > 0
        self._top = 0  # the last direct batch's padded rows (``padded_rows``)
        self.max_batch = max(config.max_batch_size, 1)
        self.preferred = config.preferred or frozenset({self.max_batch})
        self.max_preferred = max(self.preferred)
        self.cap = queue_cap  # server-wide safety cap on queued requests; 0 = none
        self.open: dict[SequenceId, Sequence] = {}  # sequences that take more requests
        self.backlog: deque[Sequence] = deque()  # started, waiting for a slot
        self.homes: dict[Instance, InstanceSlots] = {}
        self.lost: dict[SequenceId, int] = {}  # sequences whose instance went away -> when
        self._size = 0
        self._timed = 0  # queued requests with a client deadline
        self._next_expiry = 0  # nothing idles out or expires before this (a lower bound); 0 = nothing will
        self._released = False

    def __len__(self) -> int:
        return self._size

    # --- arrival -------------------------------------------------------------------------

    def push(self, item: Pending) -> None:
        """Queue ``item`` behind its sequence; raises Triton's INVALID_ARG errors for a
        request that cannot belong to a sequence, UNAVAILABLE when full or lost."""
        # Triton's checks in its order: the id's type (InferenceRequest::ValidateCorrelationId),
        # the batch size, then the id itself (SequenceBatchScheduler::Enqueue).
        params = item.request.parameters
        sid = params.get("sequence_id") if params else None
        if sid is not None and self.config.corrid_name and (type(sid) is str) != self.config.string_ids:
            raise invalid_arg(
                f"[request id: {item.request.request_id or '<id_unknown>'}] sequence batching control "
                f"'{self.config.corrid_name}' data-type is '{'BYTES' if type(sid) is str else 'UINT64'}', "
                f"but model '{self.model}' expects '{self.config.corrid_datatype}'"
            )
        if item.rows != 1:
            raise invalid_arg(
                f"inference request to model '{self.model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        if not sid:
            raise invalid_arg(
                f"inference request to model '{self.model}' must specify a non-zero or non-empty correlation ID"
            )
        if type(sid) is int and sid < 0:
            sid += 1 << 64  # a gRPC int64_param: Triton reads it as the uint64 it encodes
        if self.cap and self._size >= self.cap:
            raise unavailable(
                f"Exceeds maximum queue size: {self._size} requests already wait for this model "
                "(the server's --max-queue-size)"
            )
        start = params.get("sequence_start") is True
        end = params.get("sequence_end") is True
        now = item.arrival_ns
        seq = self.open.get(sid)
        if seq is None:
            if not start:
                if sid in self.lost:
                    raise unavailable(
                        f"sequence {sid} of model '{self.model}' was lost when the instance running it went away; "
                        "start it again with the START flag"
                    )
                raise invalid_arg(
                    f"inference request for sequence {sid} to model '{self.model}' must specify the START flag on "
                    "the first request of the sequence"
                )
            if self.lost:
                self.lost.pop(sid, None)
            seq = Sequence(sid, now)
            self._bind(seq)
            if seq.waiting and params:
                self._backlog_timeout(seq, params.get("timeout"), now)
            if not end:
                self.open[sid] = seq
        else:
            if start:
                # Triton's choice: the new sequence continues the unfinished one's slot
                # (START resets the state), so that slot is not leaked.
                log.warning(
                    "sequence %s for model '%s' has a conflict: the previous sequence did not end before this "
                    "sequence start; it is terminated early", sid, self.model,
                )
            seq.last_ns = now
            if seq.waiting and params:
                self._backlog_timeout(seq, params.get("timeout"), now)
            if end:
                del self.open[sid]
        item.sequence = m.SequenceStep(-1, start, end, sid)
        seq.queue.append(item)
        self._size += 1
        deadline = item.request.deadline_ns
        if deadline:
            self._timed += 1
            self._note_expiry(deadline)

    def _bind(self, seq: Sequence) -> None:
        best: InstanceSlots | None = None
        for home in self.homes.values():
            if home.free and (best is None or len(home.free) > len(best.free)):
                best = home
        if best is None:
            seq.waiting = True
            self.backlog.append(seq)
        else:
            best.bound[heapq.heappop(best.free)] = seq

    def _backlog_timeout(self, seq: Sequence, timeout_us: object, now: int) -> None:
        """A request with a ``timeout`` (microseconds) joined ``seq`` in the backlog: it expires by then."""
        if type(timeout_us) is not int or timeout_us <= 0:
            return
        when = now + timeout_us * 1000
        if not seq.expires_ns or when < seq.expires_ns:
            seq.expires_ns = when
            self._note_expiry(when)

    def _unwait(self) -> Sequence:
        """The oldest sequence of the backlog, which gets a slot: its timeouts no longer apply."""
        seq = self.backlog.popleft()
        seq.waiting, seq.expires_ns = False, 0
        return seq

    def _release(self, home: InstanceSlots, slot: int) -> None:
        """``slot`` is done with its sequence: it goes to the oldest one in the backlog."""
        if home.closing:
            home.bound[slot] = None
        elif self.backlog:
            home.bound[slot] = self._unwait()
        else:
            home.bound[slot] = None
            heapq.heappush(home.free, slot)

    # --- instances -------------------------------------------------------------------------

    def retire(self, instance: Instance) -> bool:
        """An instance update removes ``instance``: True when it holds sequences, which it then runs to their
        end (as Triton's removed instances do) without taking a new one; False when it may go now."""
        home = self.homes.get(instance)
        if home is None or not self.holds(instance):
            return False
        home.closing = True
        home.free.clear()
        return True

    def holds(self, instance: Instance) -> bool:
        """``instance`` has a sequence bound to one of its slots."""
        home = self.homes.get(instance)
        return home is not None and any(seq is not None for seq in home.bound)

    def sync(self, instances: list[Instance], now: int) -> Expired:
        """Follow the version's instances: a new serving instance brings free slots;
        one that stopped serving, left, or moved to another worker loses its
        sequences. Returns the queued requests that can no longer run."""
        homes = self.homes
        gone: Expired = []
        serving = 0
        for inst in instances:
            if not inst.serving:
                continue
            serving += 1
            home = homes.get(inst)
            if home is not None and home.worker == inst.worker:
                continue
            if home is not None:
                self._lose(home, now, gone)
            slots = self.config.slots
            homes[inst] = home = InstanceSlots(inst, inst.worker, [None] * slots, list(range(slots)))
            while home.free and self.backlog:
                home.bound[heapq.heappop(home.free)] = self._unwait()
        if len(homes) != serving:  # some home's instance stopped serving or was removed
            for inst in [i for i in homes if not i.serving or i not in instances]:
                self._lose(homes.pop(inst), now, gone)
        return gone

    def _lose(self, home: InstanceSlots, now: int, gone: Expired) -> None:
        for seq in home.bound:
            if seq is None:
                continue
            why = unavailable(
                f"the instance running sequence {seq.id} of model '{self.model}' went away (its worker exited or "
                "restarted); start the sequence again with the START flag"
            )
            for item in seq.queue:
                gone.append((item, why))
                self._left(item)
            seq.queue.clear()
            if self.open.get(seq.id) is seq:
                del self.open[seq.id]
                self.lost[seq.id] = now
                self._note_expiry(now + self.config.max_idle_ns)

    def homes_to_run(self) -> Iterator[InstanceSlots]:
        return iter(self.homes.values())

    def take_released(self) -> list[tuple[Instance, list[int]]]:
        """Slots that idled out since the last call, per instance: their state is to be dropped."""
        if not self._released:
            return []
        self._released = False
        out = []
        for home in self.homes.values():
            if home.released:
                out.append((home.instance, home.released))
                home.released = []
        return out

    # --- batches ---------------------------------------------------------------------------

    def next_batch(self, home: InstanceSlots, now_ns: int) -> list[Pending] | int | None:
        """A batch for ``home``'s instance to run now, or the time (ns) to ask again, or None."""
        if self.held_until and self._held():
            return None  # asked again as each request arrives
        if self.config.oldest:
            return self._oldest(home, now_ns)
        return self._direct(home, now_ns)

    def padded_rows(self, batch: list[Pending]) -> int:
        """The rows ``batch`` (the last one ``next_batch`` formed) runs as: with ``--sequence-slot-padding``,
        every slot up to the highest one holding a request, in the batch or not (another shape: it waits),
        as Triton's direct batch; the others run as not-ready rows. Else 0: its own rows."""
        if not self.pads:
            return 0
        return self._top if self._top > len(batch) else 0

    def _held(self) -> bool:
        """Whether the test hooks still hold every instance's batches (Triton's DelayScheduler)."""
        backlogged = sum(len(seq.queue) for seq in self.backlog)
        if self._size - backlogged < self.held_until or backlogged < self.backlog_held_until:
            return True
        self.held_until = self.backlog_held_until = 0
        return False

    def _direct(self, home: InstanceSlots, now_ns: int) -> list[Pending] | int | None:
        key: tuple[object, ...] | None = None
        count = 0
        oldest = 0
        top = 0  # past the highest slot with a request, whatever its shape: a padded batch's rows, as Triton's
        for slot, seq in enumerate(home.bound):
            if seq is None or not seq.queue:
                continue
            top = slot + 1
            head = seq.queue[0]
            if key is None:
                key, oldest = head.shape_key, head.arrival_ns
            elif head.shape_key != key:
                continue
            elif head.arrival_ns < oldest:
                oldest = head.arrival_ns
            count += 1
        if key is None:
            return None
        config = self.config
        if config.max_delay_ns and count < config.min_slot_utilization * config.slots:
            due = oldest + config.max_delay_ns
            if now_ns < due:
                return due
        batch = []
        for slot, seq in enumerate(home.bound):
            if seq is not None and seq.queue and seq.queue[0].shape_key == key:
                batch.append(self._take(home, slot, seq, now_ns))
        self._top = top
        return batch

    def _oldest(self, home: InstanceSlots, now_ns: int) -> list[Pending] | int | None:
        # (arrival, slot) is unique: the sort never compares sequences.
        heads = [(seq.queue[0].arrival_ns, slot, seq) for slot, seq in enumerate(home.bound)
                 if seq is not None and seq.queue]
        if not heads:
            return None
        heads.sort()
        chosen: list[tuple[int, Sequence]] = []
        key = heads[0][2].queue[0].shape_key
        best = 0  # the largest preferred size reached
        blocked = False
        for _, slot, seq in heads:
            if len(chosen) == self.max_batch or seq.queue[0].shape_key != key:
                blocked = True
                break
            chosen.append((slot, seq))
            if len(chosen) in self.preferred:
                best = len(chosen)
        oldest = heads[0][0]
        delay = self.config.max_delay_ns
        waited_enough = delay > 0 and now_ns - oldest >= delay
        if best and not waited_enough:
            take = best
        elif blocked or len(chosen) >= self.max_preferred or not delay or waited_enough:
            take = len(chosen)
        else:
            return oldest + delay
        return [self._take(home, slot, seq, now_ns) for slot, seq in chosen[:take]]

    def _take(self, home: InstanceSlots, slot: int, seq: Sequence, now_ns: int) -> Pending:
        item = seq.queue.popleft()
        self._left(item)
        step = item.sequence
        assert step is not None
        step.slot = slot
        # Idle counts from here too: a request that waited long (in the backlog, or
        # behind a slow batch) does not leave its sequence idle on arrival.
        seq.last_ns = now_ns
        if step.end:
            self._release(home, slot)
        elif not seq.queue:
            self._note_expiry(now_ns + self.config.max_idle_ns)
        return item

    # --- leaving unexecuted ----------------------------------------------------------------

    def _left(self, item: Pending) -> None:
        self._size -= 1
        if item.request.deadline_ns:
            self._timed -= 1

    def _note_expiry(self, when: int) -> None:
        if not self._next_expiry or when < self._next_expiry:
            self._next_expiry = when

    def _sequences(self) -> Iterator[Sequence]:
        for home in self.homes.values():
            for seq in home.bound:
                if seq is not None:
                    yield seq
        yield from self.backlog

    def pop(self) -> Pending:
        """Some queued request (the model is going away: every one of them is answered)."""
        for seq in self._sequences():
            if seq.queue:
                item = seq.queue.popleft()
                self._left(item)
                return item
        raise IndexError("pop from empty SequenceBatcher")

    def remove_sequence(self, ingress: bytes, request_id: int) -> list[Pending]:
        """Cancel a queued request with its whole sequence, as Triton's sequence batcher: the request first, then
        the sequence's other queued requests; the sequence ends (its slot frees, its state goes, a later request
        of it must START again). Empty: no such queued request."""
        for home in self.homes.values():
            for slot, seq in enumerate(home.bound):
                if seq is not None and self._holds(seq, ingress, request_id):
                    gone = self._cancel(seq, ingress, request_id)
                    home.released.append(slot)
                    self._released = True
                    self._release(home, slot)
                    return gone
        for seq in self.backlog:
            if self._holds(seq, ingress, request_id):
                self.backlog.remove(seq)
                return self._cancel(seq, ingress, request_id)
        return []

    @staticmethod
    def _holds(seq: Sequence, ingress: bytes, request_id: int) -> bool:
        return any(item.request.id == request_id and item.ingress == ingress for item in seq.queue)

    def _cancel(self, seq: Sequence, ingress: bytes, request_id: int) -> list[Pending]:
        first = [item for item in seq.queue if item.request.id == request_id and item.ingress == ingress]
        gone = first + [item for item in seq.queue if item is not first[0]]
        for item in gone:
            self._left(item)
        seq.queue.clear()
        self._close(seq)
        return gone

    def remove(self, ingress: bytes, request_id: int) -> Pending | None:
        for seq in self._sequences():
            for item in seq.queue:
                if item.request.id == request_id and item.ingress == ingress:
                    seq.queue.remove(item)
                    self._left(item)
                    if not seq.queue:
                        self._note_expiry(seq.last_ns + self.config.max_idle_ns)
                    return item
        return None

    @property
    def next_expiry_ns(self) -> int:
        """When ``take_expired`` may next have something to do; 0 = never."""
        return self._next_expiry

    def take_expired(self, now_ns: int) -> Expired:
        """End the sequences idle for ``max_sequence_idle_microseconds`` (their slots free,
        see ``take_released``) and remove the requests whose client deadline passed."""
        if not self._next_expiry or now_ns < self._next_expiry:
            return []
        self._next_expiry = 0
        gone: Expired = []
        for home in self.homes.values():
            for slot, seq in enumerate(home.bound):
                if seq is not None and self._idle(seq, now_ns, gone):
                    self._close(seq)
                    home.released.append(slot)
                    self._released = True
                    self._release(home, slot)
        if self.backlog:
            waiting: deque[Sequence] = deque()
            for seq in self.backlog:
                if seq.expires_ns and seq.expires_ns <= now_ns:
                    gone.extend((item, SEQUENCE_TIMEOUT) for item in seq.queue)
                    for item in seq.queue:
                        self._left(item)
                    seq.queue.clear()
                    self._close(seq)
                elif self._idle(seq, now_ns, gone):
                    self._close(seq)
                else:
                    if seq.expires_ns:
                        self._note_expiry(seq.expires_ns)
                    waiting.append(seq)
            self.backlog = waiting
        idle = self.config.max_idle_ns
        for sid, when in list(self.lost.items()):
            if now_ns - when >= idle:
                del self.lost[sid]
            else:
                self._note_expiry(when + idle)
        return gone

    def _idle(self, seq: Sequence, now_ns: int, gone: Expired) -> bool:
        """Drops ``seq``'s requests past their deadline; True when it is idle for good."""
        queue = seq.queue
        if self._timed and queue:
            kept: deque[Pending] = deque()
            for item in queue:
                deadline = item.request.deadline_ns
                if deadline and deadline <= now_ns:
                    gone.append((item, DEADLINE_PASSED))
                    self._left(item)
                    continue
                if deadline:
                    self._note_expiry(deadline)
                kept.append(item)
            seq.queue = queue = kept
        if queue:
            return False
        expires = seq.last_ns + self.config.max_idle_ns
        if now_ns >= expires:
            return True
        self._note_expiry(expires)
        return False

    def _close(self, seq: Sequence) -> None:
        if self.open.get(seq.id) is seq:
            del self.open[seq.id]
