"""deploy/settings.py: each setting declared once reaches the actor that uses it, typed.

For every setting of ``conveyor serve``, a value other than its default is parsed, handed to
the children the supervisor starts (their real command lines), parsed back by each child's own
parser, and found there; a setting no one uses, or one a child uses but is never given, fails."""

from __future__ import annotations

import argparse
import os
import sys
import types
import typing
from typing import Any

import pytest

from conveyor.deploy.cli import _fold_triton_aliases, build_parser, build_tritonserver_parser
from conveyor.deploy.instances import INGRESS_PROTOCOLS
from conveyor.deploy.settings import (
    CHILDREN,
    DECLARED,
    INGRESS,
    ROUTER,
    SERVE,
    SETTINGS,
    SUPERVISOR,
    WORKER,
    CloudIngressSettings,
    GrpcIngressSettings,
    HttpIngressSettings,
    IngressSettings,
    MetricsIngressSettings,
    OpenAiIngressSettings,
    RouterSettings,
    ServeSettings,
    Setting,
    Settings,
    WorkerSettings,
    settings_of,
)
from conveyor.deploy.supervisor import Supervisor
from conveyor.deploy.triton_flags import UNUSED, unused_given
from tests.deploy.test_tritonserver_cli import TRITON_251_FLAGS, TRITON_LATER_FLAGS

LEVEL = "unit"

# Values whose text a derived one would not parse (flag: text).
_SAMPLES = {
    "--group": "other", "--dispatch-cpu": "off", "--spin-us": "7", "--log-file": "/tmp/conveyor-test.log",
    "--http-address": "127.0.0.2", "--grpc-address": "127.0.0.3", "--metrics-address": "127.0.0.4",
    "--openai-address": "127.0.0.5", "--http-restricted-api": "health,statistics:k=v",
    "--grpc-restricted-protocol": "inference:k=v", "--openai-restricted-api": "health,metrics:k=v",
    "--http-header-forward-pattern": "-x-.*", "--sagemaker-model-root": "/srv/ml/models",
    "--grpc-server-cert": "/etc/c.pem", "--grpc-server-key": "/etc/k.pem", "--grpc-root-cert": "/etc/ca.pem",
    "--http-ssl-cert": "/etc/h.pem", "--http-ssl-key": "/etc/hk.pem", "--model-repository": "/models",
    "--responses-store": "/srv/responses.sqlite3",
    "--cache-config": "local,size=4096", "--rate-limit-resource": "R1:2:0",
    "--metrics-config": "summary_latencies=true",
    "--trace-config": "rate=9", "--trace-level": "TENSORS", "--trace-file": "/tmp/t.json",
    "--backend-config": "onnxruntime,intra_op_thread_count=2", "--sagemaker-safe-port-range": "8000-8002",
    "--load-model": "simple", "--model-config-name": "h100", "--model-load-thread-count": "2",
    "--tool-call-parser": "hermes",
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
    supervisor = Supervisor(ServeSettings.of(a))
    started = {ROUTER: supervisor._router_child(_repos(a)), WORKER: supervisor._new_child("workers"),
               INGRESS: supervisor._new_child("http-ingress")}
    out = {}
    for actor, started_child in started.items():
        argv = started_child.argv
        assert argv[0] == actor
        # The secrets a child is handed in its environment (Setting.secret_env), as its parser reads them.
        saved = {k: os.environ.get(k) for k in started_child.secrets}
        os.environ.update(started_child.secrets)
        try:
            parser = build_parser()
            child = parser.parse_args(argv)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _fold_triton_aliases(parser, child)
        out[actor] = child
    return out


def _serve_settings() -> list[Setting]:
    return [s for s in SETTINGS if SERVE in s.commands]


# Flags of serve that a child's parser also takes but the supervisor does not hand it: the child
# does not use them.
ACCEPTED_NOT_HANDED = {
    # What the supervisor decides: which ingress processes run at all.
    ("--allow-http", INGRESS), ("--allow-grpc", INGRESS), ("--allow-metrics", INGRESS),
    ("--allow-sagemaker", INGRESS), ("--allow-vertex-ai", INGRESS), ("--openai-ingress", INGRESS),
    ("--sagemaker-safe-port-range", INGRESS),  # checked once, by the supervisor, before anything starts
}


# What the supervisor hands a child in place of the parsed value.
HANDED_ITS_OWN: dict[tuple[str, str], Any] = {
    (ROUTER, "drain_grace_secs"): 0.0,  # the router stops after the ingress, which carry the grace
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
            expected = HANDED_ITS_OWN.get((actor, s.name), expected)
            assert getattr(child, s.name) == expected, (
                f"{_sample(setting)}: the {actor} has {s.name}={getattr(child, s.name)!r}, not {expected!r}")
        if actor in setting.actors and (actor, setting.name) not in HANDED_ITS_OWN:
            # What the setting changed (itself, or what Triton's alias folded into) reached this child.
            assert vars(child) != vars(plain[actor]), f"{_sample(setting)} did not reach the {actor}"


def test_paths_reach_the_ingress_as_absolute_paths() -> None:
    child = _child_namespaces(_serve(["--http-ssl-cert=c.pem", "--http-ssl-key=k.pem"]))[INGRESS]
    assert child.http_ssl_cert.startswith("/") and child.http_ssl_cert.endswith("/c.pem")


def test_the_triton_flags_are_tritons_whole_command_line() -> None:
    """The settings marked as Triton's are the flags of `tritonserver --help` (Triton 2.51, and the few
    added since that Conveyor takes)."""
    declared = {flag for s in SETTINGS if s.triton for flag in s.flags}
    assert declared == {flag for flag, _ in TRITON_251_FLAGS + TRITON_LATER_FLAGS}


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


# --- the typed settings each actor reads ----------------------------------------------------------

ACTOR_SETTINGS: dict[str, type[Settings]] = {ROUTER: RouterSettings, WORKER: WorkerSettings, INGRESS: IngressSettings}


def _subclasses(cls: type[Settings]) -> set[type[Settings]]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_declaring_class_is_in_the_table() -> None:
    declaring = {cls for cls in _subclasses(Settings) if cls.declared()}
    assert declaring == set(DECLARED)
    combined: list[type[Settings]] = [RouterSettings, WorkerSettings, IngressSettings, ServeSettings,
                                      *INGRESS_KINDS.values()]
    assert all(not cls.declared() for cls in combined)


# What each ``--protocol`` reads (deploy/cli.py builds it from the same parsed flags).
INGRESS_KINDS: dict[str, type[Settings]] = {
    "http": HttpIngressSettings, "grpc": GrpcIngressSettings, "openai": OpenAiIngressSettings,
    "sagemaker": CloudIngressSettings, "vertex": CloudIngressSettings, "metrics": MetricsIngressSettings}


def test_each_ingress_kind_reads_part_of_what_every_ingress_is_handed() -> None:
    """One ``ingress`` command (and systemd unit) for every kind, so each process is handed all of
    IngressSettings; each kind's class is part of it, and together they are all of it."""
    every = {s.name for s in IngressSettings.settings()}
    kinds = [{s.name for s in cls.settings()} for cls in INGRESS_KINDS.values()]
    assert all(kind <= every for kind in kinds) and set().union(*kinds) == every
    assert set(INGRESS_KINDS) == set(INGRESS_PROTOCOLS)


@pytest.mark.parametrize("actor", CHILDREN)
def test_an_actors_typed_settings_are_what_it_uses_and_its_own_flags(actor: str) -> None:
    """A class left out of an actor's settings, or one too many, fails here, not at run time."""
    typed = {s.name for s in ACTOR_SETTINGS[actor].settings()}
    used = {s.name for s in SETTINGS if actor in s.actors or actor in s.only}
    assert typed == used


def test_serves_typed_settings_are_every_flag_it_takes() -> None:
    assert [s.flags for s in ServeSettings.settings()] == [s.flags for s in settings_of(SERVE)]


def _is(value: Any, annotation: Any) -> bool:
    """Whether a parsed value fits its declared type (the types the declarations use)."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return any(_is(value, arm) for arm in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_is(v, item) for v in value)
    if origin is tuple:
        arms = typing.get_args(annotation)
        return isinstance(value, tuple) and all(_is(v, t) for v, t in zip(value, arms, strict=True))
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: c.__name__)
def test_each_declared_type_is_what_its_flag_parses_to(cls: type[Settings]) -> None:
    """Defaults and sample values, parsed by the command that takes them, have the declared types."""
    for s in cls.declared():
        declared = eval(cls.__annotations__[s.name], vars(sys.modules[cls.__module__]))  # the annotation's text
        command = next(iter(sorted(s.only))) if s.only else SERVE
        for argv in ([], _sample(s)):
            parsed = build_parser().parse_args([command, *_required(command), *argv])
            value = getattr(parsed, s.name)
            assert _is(value, declared), f"{s.flags[0]} {argv}: {value!r} is not {declared}"


def _required(command: str) -> list[str]:
    return {ROUTER: ["--model-repository=/m"], INGRESS: ["--protocol=http"]}.get(command, [])


def test_typed_settings_read_the_parsed_values() -> None:
    a = _serve(["--http-port=9100", "--workers=3", "--log-verbose=1", "--max-queue-size=7"])
    serve = ServeSettings.of(a)
    assert (serve.http_port, serve.workers, serve.log_verbose, serve.max_queue_size) == (9100, 3, 1, 7)
    router = RouterSettings.of(_child_namespaces(a)[ROUTER])
    assert (router.max_queue_size, router.log_verbose, router.drain_grace_secs) == (7, 1, 0.0)
