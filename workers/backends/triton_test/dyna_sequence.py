"""``backend: "dyna_sequence"`` (Triton's src/test/dyna_sequence): ``sequence``'s accumulator
(``sequence.py``), with END and CORRID: the END request adds its correlation id (cut to INT32) to
the accumulator before answering, and the sequence's accumulator goes.

The config: ``sequence_batching`` with the four control inputs ``START``, ``END``, ``READY`` and
``CORRID``, CORRID of TYPE_UINT64 or TYPE_STRING (a string id must read as an integer); ``INPUT``
and ``OUTPUT`` as for ``sequence``; ``execute_delay_ms``. CPU instances only.

Triton's backend keys its accumulators by correlation id; Conveyor's by sequence slot, which
holds one sequence from its START to its end, so the answers are the same and an accumulator
never outlives its slot (a sequence that idles out leaves nothing behind).
"""

from __future__ import annotations

import re

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.backends.triton_test.sequence import SequenceBackend, flag, int32
from conveyor.workers.backends.triton_test.settings import need

_CONTROLS = "'START', 'END, 'READY' and 'CORRID' must be configured as the control inputs"  # sic
_DIGITS = re.compile(r"\s*([+-]?\d+)")  # std::stoi's reading of a string correlation id
_INT32_MAX = 2**31 - 1


class DynaSequenceBackend(SequenceBackend):
    backend = "dyna_sequence"

    def _validate(self, config: mc.ModelConfig) -> None:
        need(config.HasField("sequence_batching"), _CONTROLS)
        controls = {c.name: c for c in config.sequence_batching.control_input}
        need(len(config.sequence_batching.control_input) == 4 and "CORRID" in controls, _CONTROLS)
        corrid = controls["CORRID"].control
        need(bool(corrid) and corrid[0].data_type in (mc.TYPE_UINT64, mc.TYPE_STRING),
             "model CORRID control input must have TYPE_UINT64 or TYPE_STRING data-type")

    def key(self, item: RequestItem) -> int | str:
        _correlation_id(item)  # a string id that does not read as an integer fails every request of its sequence
        return super().key(item)

    def finish(self, item: RequestItem, key: int | str, total: int) -> int:
        if not flag(item, "END"):
            self.accumulators[key] = total
            return total
        self.accumulators.pop(key, None)
        return int32(total + _correlation_id(item))


def _correlation_id(item: RequestItem) -> int:
    """The CORRID control's value; a string one read as C++'s ``std::stoi`` reads it."""
    corrid = item.inputs["CORRID"].reshape(-1)[0]
    if isinstance(corrid, bytes | str):
        text = corrid.decode("utf-8", "replace") if isinstance(corrid, bytes) else corrid
        found = _DIGITS.match(text)
        if found is None or abs(int(found.group(1))) > _INT32_MAX:
            raise invalid_arg("dyna sequence backend expects correlation ID to be decodable into an integer")
        return int(found.group(1))
    return int(corrid)

