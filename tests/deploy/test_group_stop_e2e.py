"""A group that stops does not move a leaving worker's instances to another worker: every worker leaves. Before,
the instance of a model slow to create (qa/L0_lifecycle's identity_zero_1_int32, creation_delay_sec 10) was
placed on the other worker as the first one left, loaded there while that one left too, and held the stop until
the exit timeout: the router was killed and the group exited 1 (L0_lifecycle's `wait $SERVER_PID` then failed)."""

from __future__ import annotations

import os

from tests.support.group import start_server
from tests.support.triton_test_models import write

LEVEL = "e2e"

CREATION_S = 8  # each instance's load: longer than the exit timeout below
EXIT_TIMEOUT_S = 5


def test_a_stopping_group_moves_no_instance_between_its_leaving_workers(tmp_path: object) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    # Two instances on two workers: whichever worker leaves first, the other one hosts an instance too.
    write(repo, "slow_to_create", f"""
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
parameters [ {{ key: "creation_delay_sec" value: {{ string_value: "{CREATION_S}" }} }} ]
""")
    server = start_server(repo, f"gs{os.getpid()}", "--workers", "2", "--exit-timeout-secs", str(EXIT_TIMEOUT_S),
                          ready_timeout=CREATION_S + 60)
    assert server.stop(timeout=EXIT_TIMEOUT_S + 60) == 0  # not "Exit timeout expired" (1), the router not killed
