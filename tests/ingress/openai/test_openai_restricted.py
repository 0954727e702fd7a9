"""``--openai-restricted-api`` (Triton's OpenAI frontend's flag) and how it joins ``--http-restricted-api``,
without the process group: the flag's forms and Triton's words for its mistakes, each OpenAI route in its
categories, and the refusal as Triton's OpenAI frontend answers it. The group: tests/e2e/test_attack_reach.py."""

from __future__ import annotations

from types import SimpleNamespace

import falcon.testing
import pytest

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.openai.app import OpenAiOptions, build_openai_app
from conveyor.ingress.restricted import (
    Restriction,
    openai_restrictions,
    parse_group,
    parse_openai_group,
    port_rules,
    restrictions,
)
from tests.support.fake_http import ANSWERS, EchoPlane, FakeLink

LEVEL = "unit"

# Every route of the OpenAI port and the categories that restrict it.
ROUTES = [
    ("GET", "/v1/models", {"model-repository", "metadata"}),
    ("GET", "/v1/models/m", {"model-repository", "metadata"}),
    ("POST", "/v1/completions", {"inference"}),
    ("POST", "/v1/chat/completions", {"inference"}),
    ("POST", "/v1/messages", {"inference"}),  # Anthropic's: refused in its form
    ("POST", "/v1/messages/count_tokens", {"inference"}),
    ("POST", "/v1/responses", {"inference"}),  # OpenAI's Responses API and its stored responses
    ("GET", "/v1/responses/resp_1", {"inference"}),
    ("DELETE", "/v1/responses/resp_1", {"inference"}),
    ("POST", "/v1/responses/resp_1/cancel", {"inference"}),
    ("POST", "/v1/embeddings", {"inference"}),
    ("POST", "/tokenize", {"inference"}),
    ("POST", "/detokenize", {"inference"}),
    ("GET", "/health", {"health"}),
    ("GET", "/version", {"metadata"}),
    ("POST", "/v1/load_lora_adapter", {"model-repository"}),
    ("POST", "/v1/unload_lora_adapter", {"model-repository"}),
    ("POST", "/v1/models/m/load", {"model-repository"}),  # Triton's "POST /v1/models/"
    ("POST", "/v1/models/m/unload", {"model-repository"}),
]


def refusal(header: str, path: str = "") -> dict[str, object]:
    message = f"This API is restricted, expecting header '{header}' with valid value"
    if path.startswith("/v1/messages"):
        return {"type": "error", "error": {"type": "authentication_error", "message": message}}
    return {"error": {"message": message, "type": "authentication_error", "code": "invalid_auth"}}


def app_client(rules: dict[str, Restriction]) -> falcon.testing.TestClient:
    ctx = SimpleNamespace(link=FakeLink(dict(ANSWERS)), dataplane=EchoPlane(), drain=IngressDrain())
    return falcon.testing.TestClient(build_openai_app(ctx, OpenAiOptions(restricted=rules)))  # type: ignore[arg-type]


def test_tritons_three_words_and_the_one_word_form() -> None:
    three = parse_openai_group(["inference,model-repository", "admin-key", "admin-value"])
    one = parse_openai_group(["inference,model-repository:admin-key=admin-value"])
    assert three == one and three.categories == ("inference", "model-repository")


@pytest.mark.parametrize(("words", "message"), [
    (["unknown-endpoint", "k", "v"], "Unknown API 'unknown-endpoint'. Available APIs: "
                                     "['inference', 'model-repository', 'metrics', 'health']"),
    (["inference,unknown", "k", "v"], "Unknown API 'unknown'"),
    (["metadata", "k", "v"], "Unknown API 'metadata'"),  # an HTTP category, not the OpenAI frontend's
    (["inference", "k"], "expected <api>,<api>... <key> <value>"),
    (["inference", "k", ""], "expected <api>,<api>... <key> <value>"),
    (["inference:k="], "expected <api>,<api>...:<key>=<value>"),
])
def test_malformed_values_are_refused_in_tritons_words(words: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_openai_group(words)


def test_a_category_in_two_groups_is_refused_in_tritons_words() -> None:
    duplicated = "restricted api 'inference' can not be specified in multiple config groups"
    for groups in ([["inference,inference", "k", "v"]],
                   [["inference", "a", "1"], ["model-repository,inference", "b", "2"]]):
        with pytest.raises(ValueError, match=duplicated):
            openai_restrictions([parse_openai_group(g) for g in groups])


def test_each_port_takes_its_own_flag_where_both_name_a_category() -> None:
    http = restrictions([parse_group("inference,metadata:admin-key=a")])
    oai = openai_restrictions([parse_openai_group(["inference,metrics", "ops-key", "b"])])
    assert port_rules(http, oai) == {"inference": Restriction("admin-key", "a"),
                                     "metadata": Restriction("admin-key", "a"), "metrics": Restriction("ops-key", "b")}
    assert port_rules(oai, http) == {"inference": Restriction("ops-key", "b"),
                                     "metadata": Restriction("admin-key", "a"), "metrics": Restriction("ops-key", "b")}


@pytest.mark.parametrize("category", ["inference", "model-repository", "metadata", "health"])
def test_every_route_of_a_restricted_category_needs_the_header(category: str) -> None:
    client = app_client({category: Restriction("k", "v")})
    for method, path, categories in ROUTES:
        refused = client.simulate_request(method, path, headers={"k": "wrong"})
        if category in categories:
            assert (refused.status_code, refused.json) == (401, refusal("k", path)), path
            assert refused.headers.get("x-request-id")  # every answer carries one
            assert client.simulate_request(method, path, headers={"K": "v"}).status_code != 401, path
        else:
            assert refused.status_code != 401, path


def test_a_route_in_two_restricted_categories_needs_both_headers() -> None:
    client = app_client({"metadata": Restriction("a", "1"), "model-repository": Restriction("b", "2")})
    assert client.simulate_get("/v1/models", headers={"a": "1"}).json == refusal("b")
    assert client.simulate_get("/v1/models", headers={"b": "2"}).json == refusal("a")
    assert client.simulate_get("/v1/models", headers={"a": "1", "b": "2"}).status_code != 401


def test_no_restriction_no_middleware() -> None:
    client = app_client({})
    for method, path, _ in ROUTES:
        assert client.simulate_request(method, path).status_code != 401, path


def test_serve_names_the_categories_left_open_on_grpc() -> None:
    from conveyor.deploy.cli import build_parser
    from conveyor.deploy.options import grpc_left_open, http_rules, metrics_rules, openai_rules
    from conveyor.deploy.settings import ServeSettings

    args = ServeSettings.of(build_parser().parse_args([
        "serve", "--model-repository", "/m", "--http-restricted-api", "inference,metadata:admin-key=a",
        "--openai-restricted-api", "model-repository,metrics", "ops-key", "b",
        "--grpc-restricted-protocol", "inference:admin-key=a"]))
    assert grpc_left_open(args) == ["metadata", "model-repository"]  # conveyor serve warns of these
    assert http_rules(args)["model-repository"] == Restriction("ops-key", "b")
    assert openai_rules(args)["metadata"] == Restriction("admin-key", "a")
    assert metrics_rules(args) == {"metrics": Restriction("ops-key", "b")}
