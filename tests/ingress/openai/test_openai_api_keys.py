"""``--api-key`` (vLLM's flag) on the OpenAI port, without the process group: every model route needs a key
and refuses in OpenAI's form, health/metrics/version stay open, several keys, the flag's forms and how the
keys reach the ingress (never on a command line). The group: tests/e2e/test_attack_api_keys.py."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import falcon.testing
import pytest

from conveyor.deploy.ingress_settings import API_KEYS_ENV, VLLM_API_KEY_ENV
from conveyor.deploy.settings import INGRESS, SERVE, build_options, handoff, handoff_environment
from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.openai.api_keys import ANTHROPIC_FORM, ApiKeys
from conveyor.ingress.openai.app import OPEN_ROUTES, OpenAiOptions, build_openai_app
from tests.ingress.openai.test_openai_restricted import ROUTES
from tests.support.fake_http import ANSWERS, EchoPlane, FakeLink

LEVEL = "unit"

KEYS = ("first-key", "second-key")
REFUSAL = {"error": {"message": "Incorrect API key provided. Send 'Authorization: Bearer <key>' with one of the "
                                "server's keys.", "type": "invalid_request_error", "param": None,
                     "code": "invalid_api_key"}}


def app_client(keys: tuple[str, ...] = KEYS) -> falcon.testing.TestClient:
    ctx = SimpleNamespace(link=FakeLink(dict(ANSWERS)), dataplane=EchoPlane(), drain=IngressDrain())
    return falcon.testing.TestClient(build_openai_app(ctx, OpenAiOptions(api_keys=keys)))  # type: ignore[arg-type]


# Anthropic's routes (/v1/messages): its form, and its clients' x-api-key header besides the bearer.
ANTHROPIC_REFUSAL = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}


@pytest.mark.parametrize(("method", "path"), [(m, p) for m, p, _ in ROUTES if p not in OPEN_ROUTES])
def test_every_model_route_needs_a_key(method: str, path: str) -> None:
    client = app_client()
    anthropic = path.startswith("/v1/messages")
    wrong: list[dict[str, str]] = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "first-key"},
                                   {"Authorization": "Basic first-key"}, {"x-api-key": "wrong"}]
    if not anthropic:
        wrong.append({"x-api-key": "first-key"})
    for headers in wrong:
        refused = client.simulate_request(method, path, headers=headers, json={})
        assert (refused.status_code, refused.json) == (401, ANTHROPIC_REFUSAL if anthropic else REFUSAL), headers
    for key in KEYS:
        for headers in ({"Authorization": f"Bearer {key}"}, {"Authorization": f"bearer {key}"},
                        *([{"x-api-key": key}] if anthropic else [])):
            passed = client.simulate_request(method, path, headers=headers, json={})
            assert passed.status_code != 401, (headers, key)


def test_health_metrics_and_version_stay_open() -> None:
    client = app_client()
    for path in sorted(OPEN_ROUTES):
        assert client.simulate_get(path).status_code != 401, path
    assert OPEN_ROUTES == {"/health", "/health/ready", "/metrics", "/version"}


def test_without_keys_nothing_is_asked() -> None:
    assert app_client(()).simulate_post("/v1/completions", json={}).status_code != 401


def test_the_anthropic_form_takes_x_api_key_too() -> None:
    keys = ApiKeys(KEYS)
    assert keys.accepts("second-key") and not keys.accepts("second-ke") and not keys.accepts(None)
    request = falcon.testing.create_asgi_req(headers={"x-api-key": "first-key"})
    assert keys.presented(request, ANTHROPIC_FORM) == "first-key"
    assert keys.presented(request, "openai") is None


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    build_options(p, SERVE)
    return p.parse_args(argv)


def test_keys_come_from_flags_or_the_environment_and_never_travel_on_a_command_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    monkeypatch.delenv(VLLM_API_KEY_ENV, raising=False)
    args = parse(["--api-key", "a", "b", "--api-key", "c"])
    assert args.api_key == ["a", "b", "c"]
    assert not {"a", "b", "c"} & set(handoff(args, INGRESS)) and "--api-key" not in handoff(args, INGRESS)
    assert handoff_environment(args, INGRESS) == {API_KEYS_ENV: "a\nb\nc"}
    monkeypatch.setenv(VLLM_API_KEY_ENV, "from-vllm")
    assert parse([]).api_key == ["from-vllm"]
    monkeypatch.setenv(API_KEYS_ENV, "x\ny")  # what a child of the supervisor gets
    assert parse([]).api_key == ["x", "y"]
    assert parse(["--api-key", "z"]).api_key == ["z"]  # the flag wins
    monkeypatch.delenv(API_KEYS_ENV)
    monkeypatch.delenv(VLLM_API_KEY_ENV)
    assert handoff_environment(parse([]), INGRESS) == {}
