"""deploy/settings.py: each setting declared once reaches the actor that uses it.

For every setting of ``conveyor serve``, a value other than its default is parsed, handed to
the children the supervisor starts (their real command lines), parsed back by each child's own
parser, and found there; a setting no one uses, or one a child uses but is never given, fails."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from conveyor.deploy.cli import _fold_triton_aliases, build_parser, build_tritonserver_parser
from conveyor.deploy.settings import CHILDREN, INGRESS, ROUTER, SERVE, SETTINGS, SUPERVISOR, WORKER, Setting
from conveyor.deploy.supervisor import Supervisor
from conveyor.deploy.triton_flags import UNUSED, unused_given
from tests.deploy.test_tritonserver_cli import TRITON_251_FLAGS

# Values whose text a derived one would not parse (flag: text).
_SAMPLES = {
    "--group": "other", "--dispatch-cpu": "off", "--spin-us": "7", "--log-file": "/tmp/conveyor-test.log",
    "--http-address": "127.0.0.2", "--grpc-address": "127.0.0.3", "--metrics-address": "127.0.0.4",
    "--openai-address": "127.0.0.5", "--http-restricted-api": "health,statistics:k=v",
    "--grpc-restricted-protocol": "inference:k=v", "--http-header-forward-pattern": "-x-.*",
    "--grpc-server-cert": "/etc/c.pem", "--grpc-server-key": "/etc/k.pem", "--grpc-root-cert": "/etc/ca.pem",
    "--http-ssl-cert": "/etc/h.pem", "--http-ssl-key": "/etc/hk.pem", "--model-repository": "/models",
    "--cache-config": "local,size=4096", "--rate-limit-resource": "R1:2:0",
    "--metrics-config": "summary_latencies=true",
    "--trace-config": "rate=9", "--trace-level": "TENSORS", "--trace-file": "/tmp/t.json",
    "--backend-config": "onnxruntime,intra_op_thread_count=2", "--sagemaker-safe-port-range": "8000-8002",
    "--load-model": "simple", "--model-config-name": "h100", "--model-load-thread-count": "2",
}


def _sample(s: Setting) -> list[str]:
    """The flag with a value its default is not."""
    flag = s.flags[0]
    if s.switch:
        return [flag]
    if flag in _SAMPLES:
        return [f"{flag}={_SAMPLES[flag]}"]
    if s.choices is not None:
        return [f"{flag}={next(c for c in s.choices if c != s.default)}"]
    default = s.default
    if s.kind is not None and s.kind.__name__ in ("triton_bool", "triton_bool_int"):
        return [f"{flag}={'false' if default else 'true'}"]
    if s.kind is float:
        return [f"{flag}={(default or 0.0) + 1.5}"]
    if s.kind is int or (s.kind is not None and "int" in s.kind.__name__):
        return [f"{flag}={(default or 0) + 3}"]
    return [f"{flag}=some-text"]


def _serve(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    a = parser.parse_args(["serve", *argv])
    _fold_triton_aliases(parser, a)
    return a


def _repos(a: argparse.Namespace) -> list[str]:
    # None given: the supervisor serves the example repository it builds.
    return list(a.model_repository) or ["/tmp/example-models"]


def _child_namespaces(a: argparse.Namespace) -> dict[str, argparse.Namespace]:
    """Each child's settings, as it parses the command line the supervisor starts it with."""
    a.group = a.group or "default"  # the supervisor names the group before it starts any child
    supervisor = Supervisor(a)
    argvs = {ROUTER: supervisor._router_child(_repos(a)).argv,
             WORKER: supervisor._new_child("workers").argv, INGRESS: supervisor._new_child("http-ingress").argv}
    out = {}
    for actor, argv in argvs.items():
        assert argv[0] == actor
        parser = build_parser()
        child = parser.parse_args(argv)
        _fold_triton_aliases(parser, child)
        out[actor] = child
    return out


def _serve_settings() -> list[Setting]:
    return [s for s in SETTINGS if SERVE in s.commands]


# Flags of serve that a child's parser also takes but the supervisor does not hand it: the child
# does not use them (or, for the router's grace, is given its own value).
ACCEPTED_NOT_HANDED = {
    ("--drain-grace-secs", ROUTER),  # 0: the router stops after the ingress, which carry the grace
    # What the supervisor decides: which ingress processes run at all.
    ("--allow-http", INGRESS), ("--allow-grpc", INGRESS), ("--allow-metrics", INGRESS),
    ("--allow-sagemaker", INGRESS), ("--allow-vertex-ai", INGRESS), ("--openai-ingress", INGRESS),
    ("--sagemaker-safe-port-range", INGRESS),  # checked once, by the supervisor, before anything starts
}


def test_every_setting_of_serve_is_used_by_someone() -> None:
    nobody = [s.flags[0] for s in _serve_settings() if not s.actors]
    assert not nobody, f"settings that no actor uses: {nobody}"
    for s in SETTINGS:
        for actor in s.actors - {SUPERVISOR}:
            assert actor in s.commands, f"{s.flags[0]} is handed to the {actor}, whose parser lacks it"


def test_a_child_that_takes_a_setting_of_serve_is_handed_it() -> None:
    """A flag on a child's parser and on serve's is handed to that child, unless it is one of the
    few declared ``also`` (taken, not used): a new one of those is a choice made here, in review."""
    not_handed = {(s.flags[0], actor) for s in _serve_settings()
                  for actor in (s.commands & set(CHILDREN)) - s.actors}
    assert not_handed == ACCEPTED_NOT_HANDED


@pytest.mark.parametrize("setting", [s for s in _serve_settings() if s.actors - {SUPERVISOR}],
                         ids=lambda s: s.flags[0])
def test_a_setting_reaches_the_children_that_use_it(setting: Setting) -> None:
    default = _serve([])
    given = _serve(_sample(setting))
    assert vars(given) != vars(default), f"{_sample(setting)} parsed to the defaults"
    children = _child_namespaces(given)
    plain = _child_namespaces(_serve([]))
    for actor in CHILDREN:
        child = children[actor]
        for s in SETTINGS:
            if actor not in s.actors:
                continue
            expected: Any = getattr(given, s.name)
            if actor == ROUTER and s.name == "model_repository":
                expected = _repos(given)
            assert getattr(child, s.name) == expected, (
                f"{_sample(setting)}: the {actor} has {s.name}={getattr(child, s.name)!r}, not {expected!r}")
        if actor == ROUTER:
            assert child.drain_grace_secs == 0  # it stops after the ingress, which carry the grace
        if actor in setting.actors:
            # What the setting changed (itself, or what Triton's alias folded into) reached this child.
            assert vars(child) != vars(plain[actor]), f"{_sample(setting)} did not reach the {actor}"


def test_paths_reach_the_ingress_as_absolute_paths() -> None:
    child = _child_namespaces(_serve(["--http-ssl-cert=c.pem", "--http-ssl-key=k.pem"]))[INGRESS]
    assert child.http_ssl_cert.startswith("/") and child.http_ssl_cert.endswith("/c.pem")


def test_the_triton_flags_are_tritons_whole_command_line() -> None:
    """The settings marked as Triton's are the flags of `tritonserver --help` (Triton 2.51)."""
    declared = {flag for s in SETTINGS if s.triton for flag in s.flags}
    assert declared == {flag for flag, _ in TRITON_251_FLAGS}


def test_tritonserver_takes_every_setting_of_serve() -> None:
    serve = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[SERVE]
    triton = build_tritonserver_parser()
    assert ({s for a in serve._actions for s in a.option_strings}
            == {s for a in triton._actions for s in a.option_strings})


def test_the_unused_flags_come_from_the_table() -> None:
    assert UNUSED and all(u.triton and u.unused for u in UNUSED)
    a = build_tritonserver_parser().parse_args([f"{u.flags[0]}=1" for u in UNUSED])
    assert len(unused_given(a)) == len(UNUSED)


def test_every_flag_has_help() -> None:
    assert [s.flags[0] for s in SETTINGS if not s.help.strip()] == []
