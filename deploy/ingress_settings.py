"""The ingress processes' settings (``deploy/settings.py`` combines them): what one takes of a client's
requests, the HTTP edge and the gRPC server, access control and TLS, and the answers' defaults."""

from __future__ import annotations

import os
from typing import Any

from conveyor.deploy.flag_types import (
    FlagsOverDefault,
    OpenAiRestrictedGroup,
    RestrictedGroup,
    restricted_group,
    restricted_text,
    tool_parser,
    triton_bool,
    triton_bool_int,
)
from conveyor.deploy.setting_types import (
    INGRESS,
    Settings,
    path_text,
    setting,
)
from conveyor.ingress.http.edge import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS, WRITE_TIMEOUT_S
from conveyor.ingress.limits import (
    DEFAULT_GRPC_BUFFER_BYTES,
    DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INPUT_ELEMENTS,
    DEFAULT_MAX_JSON_BYTES,
)
from conveyor.ingress.openai.forms import ERROR_FORMS, OPENAI
from conveyor.ingress.openai.media import FETCH_TIMEOUT_S
from conveyor.ingress.openai.response_store import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_COUNT,
    STORE_FILE,
)
from conveyor.ingress.sagemaker import DEFAULT_MODEL_ROOT

_INGRESS = frozenset({INGRESS})
# The --help sections of the endpoints that are off unless asked for.
CLOUD_SECTION = "SageMaker and Vertex AI endpoints"
OPENAI_SECTION = "OpenAI-compatible endpoint"


def _grpc_keepalive(flag: str, option: str, default: int | None) -> Any:
    boolean = flag.endswith("without-calls")
    return setting((flag,), f"Triton's flag: sets the gRPC server's {option}",
                   kind=triton_bool_int if boolean else int, default=default, metavar="BOOL" if boolean else "MS",
                   triton=True, grpc_option=option)


class RequestLimits(Settings):
    """What one ingress process takes of a client's requests, whatever its protocol (ingress/limits.py)."""

    ACTORS = _INGRESS
    max_input_elements: int = setting(
        ("--max-input-elements",), "elements one input tensor may hold; more is refused with 400 / "
        f"INVALID_ARGUMENT; 0: no limit (default {DEFAULT_MAX_INPUT_ELEMENTS})",
        kind=int, default=DEFAULT_MAX_INPUT_ELEMENTS, metavar="N")
    max_json_bytes: int = setting(
        ("--max-json-bytes",), "largest JSON part of an HTTP request, plain or inflated, and of a whole OpenAI "
        "request (JSON tensors take ~8x their text in memory); more is refused with 400; 0: no limit "
        f"(default {DEFAULT_MAX_JSON_BYTES})",
        kind=int, default=DEFAULT_MAX_JSON_BYTES, metavar="BYTES")
    max_inflight_requests: int = setting(
        ("--max-inflight-requests",), "requests one ingress process holds at once; more are refused with 503 / "
        f"UNAVAILABLE 'too many requests in flight'; 0: no limit (default {DEFAULT_MAX_INFLIGHT})",
        kind=int, default=DEFAULT_MAX_INFLIGHT, metavar="N")


class HttpEdge(Settings):
    """What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each)."""

    ACTORS = _INGRESS
    http_max_body_bytes: int = setting(
        ("--http-max-body-bytes",), "largest HTTP request body, after decompression (a body that is all JSON: "
        f"--max-json-bytes too); more is 400, 413 on the OpenAI port (default {DEFAULT_MAX_BODY_BYTES})",
        kind=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES")
    # Folded into the two limits it stands for as it is parsed (options.fold_http_max_input_size): nothing
    # left to pass on.
    http_max_input_size: int | None = setting(
        ("--http-max-input-size",), "Triton's flag: the largest HTTP request JSON and request body (decompressed "
        "included); more is refused with 400 (413 on the OpenAI port, as Triton's frontend). Sets --max-json-bytes "
        "and --http-max-body-bytes, each where left "
        f"at its default (unset: those two, {DEFAULT_MAX_JSON_BYTES} and {DEFAULT_MAX_BODY_BYTES})",
        kind=int, metavar="BYTES", triton=True)
    # What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each).
    http_max_connections: int = setting(
        ("--http-max-connections",), "client connections one HTTP ingress process holds; past it the one "
        "waiting longest for a request is closed, or with none waiting the new one gets 503; 0: no limit "
        f"(default {MAX_CONNECTIONS})",
        kind=int, default=MAX_CONNECTIONS, metavar="N")
    http_header_timeout_secs: float = setting(
        ("--http-header-timeout-secs",), "a request head must arrive within this, from the connection or from "
        f"its first byte; else 408 and the connection closes; 0: no limit (default {HEADER_TIMEOUT_S:g})",
        kind=float, default=HEADER_TIMEOUT_S, metavar="S")
    http_body_timeout_secs: float = setting(
        ("--http-body-timeout-secs",), "the longest silence while a request body is still due; then 408 and "
        f"the connection closes; 0: no limit (default {BODY_TIMEOUT_S:g})",
        kind=float, default=BODY_TIMEOUT_S, metavar="S")
    http_write_timeout_secs: float = setting(
        ("--http-write-timeout-secs",), "how long a client may leave its answer unread once its send buffer is "
        "full (its connection is not read meanwhile); then it is dropped; 0: no limit "
        f"(default {WRITE_TIMEOUT_S:g})",
        kind=float, default=WRITE_TIMEOUT_S, metavar="S")


class GrpcServer(Settings):
    """The gRPC server: which one, the request bytes it holds, Triton's keepalive flags (grpc channel arguments)."""

    ACTORS = _INGRESS
    grpc_server: str = setting(
        ("--grpc-server",), "the gRPC server: ngh2 (on the event loop, over libnghttp2 through ngh2, with the "
        "HTTP/2 limits of docs/SECURITY.md; h2 if its start-up self-test fails), h2 (the same server over "
        "python-hyper's h2), each with TLS and Triton's --grpc-keepalive-*, --grpc-http2-* and "
        "--grpc-max-connection-age* flags, or grpcio (grpc.aio); auto: ngh2. Default: "
        "$CONVEYOR_GRPC_SERVER, else auto",
        default="auto", env="CONVEYOR_GRPC_SERVER", choices=("auto", "grpcio", "h2", "ngh2"))
    # The gRPC server on the event loop (--grpc-server ngh2, the default, or h2): request bytes held before calls
    # take them.
    grpc_max_buffer_bytes: int = setting(
        ("--grpc-max-buffer-bytes",), "request message bytes one gRPC ingress process holds before their calls "
        "take them; the stream past it ends with RESOURCE_EXHAUSTED; 0: no limit "
        f"(default {DEFAULT_GRPC_BUFFER_BYTES}; --grpc-server h2)",
        kind=int, default=DEFAULT_GRPC_BUFFER_BYTES, metavar="BYTES")
    grpc_max_connection_buffer_bytes: int = setting(
        ("--grpc-max-connection-buffer-bytes",), "the same per gRPC connection; a larger message is refused at "
        f"its length prefix; 0: no limit but gRPC's 2 GiB (default {DEFAULT_GRPC_CONNECTION_BUFFER_BYTES}; "
        "--grpc-server h2)", kind=int, default=DEFAULT_GRPC_CONNECTION_BUFFER_BYTES, metavar="BYTES")
    grpc_keepalive_time: int = _grpc_keepalive("--grpc-keepalive-time", "grpc.keepalive_time_ms", 7200000)
    grpc_keepalive_timeout: int = _grpc_keepalive("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 20000)
    grpc_keepalive_permit_without_calls: int = _grpc_keepalive(
        "--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", 0)
    grpc_http2_max_pings_without_data: int = _grpc_keepalive(
        "--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 2)
    grpc_http2_min_recv_ping_interval_without_data: int = _grpc_keepalive(
        "--grpc-http2-min-recv-ping-interval-without-data",
        "grpc.http2.min_ping_interval_without_data_ms", 300000)
    grpc_http2_max_ping_strikes: int = _grpc_keepalive(
        "--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 2)
    grpc_max_connection_age: int | None = _grpc_keepalive(
        "--grpc-max-connection-age", "grpc.max_connection_age_ms", None)
    # None: unset, as Triton
    grpc_max_connection_age_grace: int | None = _grpc_keepalive(
        "--grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", None)


class HttpAccess(Settings):
    """Access control on HTTP (Triton's), HTTPS (a Conveyor extension), headers forwarded as parameters."""

    ACTORS = _INGRESS
    http_restricted_api: list[RestrictedGroup] = setting(
        ("--http-restricted-api",), "HTTP requests to these APIs need header <key>: <value> (repeatable; APIs: "
        "health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging)",
        kind=restricted_group, default=[], repeatable=True, metavar="<api>,...:<key>=<value>", triton=True,
        to_text=restricted_text)
    http_ssl_cert: str = setting(
        ("--http-ssl-cert",), "serve HTTPS with this certificate (a Conveyor extension: Triton serves plain "
        "HTTP)", default="", metavar="PEM", to_text=path_text)
    http_ssl_key: str = setting(
        ("--http-ssl-key",), "the HTTPS private key", default="", metavar="PEM", to_text=path_text)
    http_header_forward_pattern: str = setting(
        ("--http-header-forward-pattern",), "request headers whose name matches become string request "
        "parameters (case-insensitive unless the pattern starts with (?-i))", default="", metavar="REGEX", triton=True)


class OpenAiAccess(Settings):
    """Access control on the OpenAI port (Triton's OpenAI frontend's flag), joined with --http-restricted-api's
    on every HTTP-family port (ingress/restricted.py ``port_rules``)."""

    ACTORS = _INGRESS
    openai_restricted_api: list[RestrictedGroup] = setting(
        ("--openai-restricted-api",), "requests to these APIs need header <key>: <value> (repeatable; APIs: "
        "inference, model-repository, metrics, health; Triton's OpenAI frontend's three words, or "
        "<api>,...:<key>=<value>). Refused on the OpenAI port with 401 and OpenAI's error body. The two "
        "restricted-API flags combine: a category either names is restricted on every HTTP, SageMaker, Vertex AI, "
        "metrics and OpenAI port that serves it, each port taking its own flag's header where both name it",
        default=[], repeatable=True, nargs="+", action=OpenAiRestrictedGroup,
        metavar="<api>,... <key> <value>", to_text=restricted_text, section=OPENAI_SECTION)


# The keys, separated by white space (a bearer token has none): how the supervisor hands them to the OpenAI ingress.
API_KEYS_ENV = "CONVEYOR_API_KEYS"
VLLM_API_KEY_ENV = "VLLM_API_KEY"  # vLLM's variable for one key, which its users set


def _api_keys_from_environment() -> list[str]:
    keys = os.environ.get(API_KEYS_ENV) or os.environ.get(VLLM_API_KEY_ENV) or ""
    return keys.split()


class OpenAiKeys(Settings):
    """API keys on the OpenAI port (vLLM's --api-key)."""

    ACTORS = _INGRESS
    api_key: list[str] = setting(
        ("--api-key",), "requests to the OpenAI port's model routes need one of these keys (vLLM's flag; "
        "repeatable, or several after one flag): 'Authorization: Bearer <key>' (the Anthropic routes also take "
        "'x-api-key: <key>'), else 401 in the route's own error form; health, metrics and /version stay open. "
        f"Default: the keys in {API_KEYS_ENV} (separated by spaces), else {VLLM_API_KEY_ENV}; prefer the environment, "
        "which other users of the host cannot read as they can a command line. Keys are never logged nor handed "
        "on a command line", default=[], nargs="+", action=FlagsOverDefault, metavar="KEY",
        default_from=_api_keys_from_environment, secret_env=API_KEYS_ENV, section=OPENAI_SECTION)


class GrpcAccess(Settings):
    """Access control and TLS on gRPC (Triton's), metadata forwarded as parameters."""

    ACTORS = _INGRESS
    grpc_restricted_protocol: list[RestrictedGroup] = setting(
        ("--grpc-restricted-protocol",), "gRPC calls to these protocols need metadata "
        "triton-grpc-protocol-<key>: <value> (repeatable)",
        kind=restricted_group, default=[], repeatable=True, metavar="<protocol>,...:<key>=<value>", triton=True,
        to_text=restricted_text)
    grpc_use_ssl: bool = setting(
        ("--grpc-use-ssl",), "serve gRPC over TLS", kind=triton_bool, default=False, metavar="BOOL", triton=True)
    grpc_use_ssl_mutual: bool = setting(
        ("--grpc-use-ssl-mutual",), "serve gRPC over mutual TLS: clients need a certificate signed by "
        "--grpc-root-cert", kind=triton_bool, default=False, metavar="BOOL", triton=True)
    grpc_server_cert: str = setting(
        ("--grpc-server-cert",), "the gRPC server's certificate (chain)", default="", metavar="PEM", triton=True,
        to_text=path_text)
    grpc_server_key: str = setting(
        ("--grpc-server-key",), "the gRPC server's private key", default="", metavar="PEM", triton=True,
        to_text=path_text)
    grpc_root_cert: str = setting(
        ("--grpc-root-cert",), "the CA certificate client certificates need", default="", metavar="PEM",
        triton=True, to_text=path_text)
    grpc_header_forward_pattern: str = setting(
        ("--grpc-header-forward-pattern",), "request metadata whose name matches become string request "
        "parameters", default="", metavar="REGEX", triton=True)


class Answers(Settings):
    """What every ingress answers with: the server's name, and the status of a client's mistakes."""

    ACTORS = _INGRESS
    server_id: str = setting(("--id",), "the server name server metadata reports", default="triton", triton=True)
    client_mistakes_as_400: bool = setting(
        ("--client-mistakes-as-400",), "answer the client mistakes Triton reports as 500 / INTERNAL (a model "
        "the repository does not hold, a malformed shape, an unopenable shared-memory key) with 400 / "
        "INVALID_ARGUMENT instead (default false: Triton's status, which its clients and QA assert)",
        kind=triton_bool, default=False, metavar="BOOL")


class CloudDefaults(Settings):
    """The cloud endpoints' defaults."""

    ACTORS = _INGRESS
    vertex_ai_default_model: str = setting(
        ("--vertex-ai-default-model",), "the model AIP_PREDICT_ROUTE infers (default: the repository's only "
        "model)", default="", metavar="NAME", triton=True, section=CLOUD_SECTION)
    sagemaker_model_root: str = setting(
        ("--sagemaker-model-root",), "where SageMaker unpacks a multi-model endpoint's archives: POST /models "
        "loads only a url <root>/<hash>/model[/<subdir>], as Triton (default /opt/ml/models; a Conveyor "
        "extension)", default=DEFAULT_MODEL_ROOT, metavar="DIR", to_text=path_text, section=CLOUD_SECTION)


class OpenAiDefaults(Settings):
    """The OpenAI endpoint's defaults (Triton's OpenAI frontend flags)."""

    ACTORS = _INGRESS
    lora_separator: str = setting(
        ("--lora-separator",), "a model name '<model><separator><adapter>' picks one of the model's LoRA "
        "adapters (Triton's flag; default: off)", default="",
        section=OPENAI_SECTION)
    default_max_tokens: int = setting(
        ("--default-max-tokens",), "max_tokens of a request that sets none (default 16, as Triton's OpenAI "
        "frontend)", kind=int, default=16, section=OPENAI_SECTION)
    tokenizer: str = setting(
        ("--tokenizer",), "the tokenizer folder (Hugging Face files, and its chat template) of a model that names "
        "none (Triton's OpenAI frontend's flag, a folder here: no download; default: none)", default="",
        metavar="FOLDER", section=OPENAI_SECTION)
    tool_call_parser: str = setting(
        ("--tool-call-parser",), "the tool-call parser of a model whose config names none in its TOOL_CALL_PARSER "
        "parameter (Triton's OpenAI frontend's flag; vLLM's parser names, and Triton's llama3; default: none)",
        kind=tool_parser, default="", metavar="NAME", section=OPENAI_SECTION)
    # Where a chat request's image_url may point besides a data: URL (ingress/openai/media.py): off by default,
    # as a server that fetches or reads what its clients name reaches what they cannot.
    openai_fetch_remote_media: bool = setting(
        ("--openai-fetch-remote-media",), "fetch a chat request's http(s) image URLs (each within 20 MiB and "
        "--openai-media-fetch-timeout-secs; default false: only data: URLs, and file: URLs under "
        "--allowed-local-media-path)", kind=triton_bool, default=False, metavar="BOOL", section=OPENAI_SECTION)
    openai_media_fetch_timeout_secs: float = setting(
        ("--openai-media-fetch-timeout-secs",), "the longest fetch of one remote image, connection to last byte "
        f"(default {FETCH_TIMEOUT_S:g})", kind=float, default=FETCH_TIMEOUT_S, metavar="S", section=OPENAI_SECTION)
    allowed_local_media_path: str = setting(
        ("--allowed-local-media-path",), "the folder a chat request's file: image URLs may name (vLLM's flag; "
        "links resolved, nothing outside it; default: none)", default="", metavar="FOLDER", section=OPENAI_SECTION)
    openai_error_form: str = setting(
        ("--openai-error-form",), "how the OpenAI port answers a refused request: openai (OpenAI's API's and "
        "vLLM's: 400 and {\"error\": {...}}; the default) or triton (Triton's OpenAI frontend's: a body outside "
        "its request schema is 422 with pydantic's {\"detail\": [...]}, other refusals {\"detail\": message}, an "
        "unknown model 400 'Unknown model: <name>'; the default of conveyor openai-frontend)",
        default=OPENAI, choices=ERROR_FORMS, section=OPENAI_SECTION)
    # The Responses API's stored responses (ingress/openai/response_store.py): one file every OpenAI ingress
    # process of the group opens, bounded three ways so that no client can fill the disk.
    responses_store: str = setting(
        ("--responses-store",), "the SQLite file of the Responses API's stored responses (store, "
        "previous_response_id), which every OpenAI ingress process of the group shares (default: "
        f"{STORE_FILE} in the group's run folder, which goes with the group)", default="", metavar="FILE",
        to_text=path_text, section=OPENAI_SECTION)
    responses_store_max_count: int = setting(
        ("--responses-store-max-count",), "stored responses kept; past it the oldest goes (default "
        f"{DEFAULT_MAX_COUNT})", kind=int, default=DEFAULT_MAX_COUNT, metavar="N", section=OPENAI_SECTION)
    responses_store_max_bytes: int = setting(
        ("--responses-store-max-bytes",), "bytes of stored responses and their conversations kept; past it the "
        f"oldest go, and a larger response is not stored (default {DEFAULT_MAX_BYTES})", kind=int,
        default=DEFAULT_MAX_BYTES, metavar="BYTES", section=OPENAI_SECTION)
    responses_store_max_age_secs: int = setting(
        ("--responses-store-max-age-secs",), "a stored response older than this is gone: 404, as an unknown "
        f"id (default {DEFAULT_MAX_AGE_S}: 30 days, as OpenAI keeps them)", kind=int, default=DEFAULT_MAX_AGE_S,
        metavar="SECONDS", section=OPENAI_SECTION)
