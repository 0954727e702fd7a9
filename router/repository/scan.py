"""Scanning Triton model repositories: ``<repo>/<model>/config.pbtxt`` and
``<repo>/<model>/<version>/<file>``.

A model whose directory or config is wrong is still listed, with the reason,
so it answers "not ready: <why>" while every other model keeps serving.
"""

from __future__ import annotations

import logging
import os
import re
import sys

from google.protobuf import text_format

from conveyor.deploy.runtime.log_settings import TRITON_FORMATS, ProcessLog
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.model_config import cpp_parse_error, parse_text
from conveyor.proto.repository_files import read_text, unreadable
from conveyor.proto.sequence_config import IDLE_DEFAULT_US
from conveyor.proto.triton_test_backends import NAMES as TRITON_TEST_BACKENDS
from conveyor.router.repository import frameworks
from conveyor.router.repository.backend_config import BackendConfig
from conveyor.router.repository.onnx_autocomplete import complete_onnx
from conveyor.router.repository.python_autocomplete import complete_python
from conveyor.router.repository.vllm_autocomplete import complete_vllm
from conveyor.router.spec.ensemble_plan import ensemble_problem
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import assign_keys, name_of
from conveyor.router.spec.triton_rules import config_problem
from conveyor.router.spec.validate import validate

log = logging.getLogger(__name__)

LIBPROTOBUF_ERROR = "[libprotobuf ERROR google/protobuf/text_format.cc:337]"  # its log line's head in Triton

# platform / backend names Triton uses, mapped to the worker backend that runs them.
_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "onnxruntime": "onnxruntime",
    "python": "python",
    "pytorch_libtorch": "pytorch",
    "pytorch": "pytorch",
    "torch_aoti": "pytorch",  # PyTorch 2: torch.export + AOTInductor, <version>/model.pt2
    "tensorrt_plan": "tensorrt",
    "tensorrt": "tensorrt",
    "vllm": "vllm",  # Triton's vllm_backend layout: <version>/model.json (router/repository/vllm_autocomplete.py)
    "ensemble": "ensemble",  # run by the router itself (router/ensembles/scheduler.py)
    **frameworks.BACKENDS,  # fil, openvino, tensorflow (router/repository/frameworks.py)
    # Triton's test backends, built in (workers/backends/triton_test/): no model file, no default file name.
    **{name: name for name in TRITON_TEST_BACKENDS},
}
_DEFAULT_FILENAME = {
    "onnxruntime": "model.onnx", "python": "model.py", "pytorch": "model.pt", "tensorrt": "model.plan", "ensemble": "",
    "vllm": "model.json",
}
# The platform Triton reports for a backend given by name alone.
_PLATFORM = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch", "tensorrt": "tensorrt_plan"}
# The backend Triton's normalization names by a config's default_model_filename (AutoCompleteBackendFields).
_FILENAME_BACKEND = {"model.plan": "tensorrt", "model.onnx": "onnxruntime", "model.xml": "openvino",
                     "model.pt": "pytorch", "model.py": "python"}
# The backends whose platforms Triton knows (GetBackendType); any other backend may name any platform.
_TYPED_BACKENDS = frozenset({"tensorflow", "tensorrt", "onnxruntime", "pytorch"})
# Model files Triton recognises a backend by when the config names none.
_MODEL_FILE_BACKEND = {".onnx": "onnxruntime", ".pt": "pytorch", ".pt2": "pytorch", ".plan": "tensorrt",
                       **frameworks.MODEL_FILE_BACKEND}
# Why a config without inputs/outputs cannot be completed, for backends (or platforms) that cannot do it.
_NOT_COMPLETED = {
    "pytorch": "a TorchScript model's config must declare its inputs and outputs: Triton cannot read them "
               "from the model file either",
    "torch_aoti": "a PyTorch 2 package (.pt2) does not record its tensors' names: declare the inputs and outputs",
    "tensorrt": "Conveyor does not complete TensorRT configs from the engine yet: declare the inputs and outputs",
    **frameworks.NOT_COMPLETED,
}


def scan(repositories: list[str], autocomplete: bool = True, *, config_name: str = "",
         backend_config: BackendConfig | None = None, namespacing: bool = False) -> dict[str, ModelSpec]:
    """Every model in every repository, by registry key. A name found twice is an error for
    that name; with ``namespacing`` (Triton's --model-namespacing) both are kept instead,
    each keyed by its directory."""
    if namespacing:
        keys = assign_keys(model_dirs(repositories))
        specs: dict[str, ModelSpec] = {}
        for key, path in keys.items():
            spec = load_spec(name_of(key), path, autocomplete=autocomplete, config_name=config_name,
                             backend_config=backend_config)
            spec.key = key if key != spec.name else ""
            specs[key] = spec
        return specs
    found: dict[str, ModelSpec] = {}
    for entry, path in model_dirs(repositories):
        if entry in found:
            found[entry].error = "model appears in two or more repositories"  # Triton's index reason
            continue
        found[entry] = load_spec(entry, path, autocomplete=autocomplete, config_name=config_name,
                                 backend_config=backend_config)
    return found


def model_dirs(repositories: list[str], quiet: bool = False) -> list[tuple[str, str]]:
    """(name, directory) of every model directory, repository by repository."""
    out: list[tuple[str, str]] = []
    for repo in repositories:
        try:
            entries = sorted(os.listdir(repo))
        except OSError as exc:
            if not quiet:
                log.error("cannot read model repository %s: %s", repo, exc)
            continue
        for entry in entries:
            path = os.path.join(repo, entry)
            if not entry.startswith(".") and os.path.isdir(path):
                out.append((entry, path))
    return out


def config_file(path: str, config_name: str = "") -> str:
    """The config a model loads from: ``configs/<name>.pbtxt`` when --model-config-name names
    one that exists, else ``config.pbtxt`` (Triton's rule)."""
    if config_name:
        custom = os.path.join(path, "configs", f"{config_name}.pbtxt")
        if os.path.isfile(custom):
            return custom
    return os.path.join(path, "config.pbtxt")


def load_spec(
    name: str, path: str, *, override: mc.ModelConfig | None = None, autocomplete: bool = True,
    config_name: str = "", backend_config: BackendConfig | None = None,
) -> ModelSpec:
    """The model in directory ``path``; ``override`` replaces its config.pbtxt (a load
    request's ``config`` parameter); without ``autocomplete`` (Triton's
    --strict-model-config) the config must declare its inputs and outputs."""
    spec = ModelSpec(name=name, path=path)
    backend_config = backend_config or BackendConfig()
    config_path = config_file(path, config_name)
    text = ""
    if override is not None:
        spec.config.CopyFrom(override)
        text = str(override)
    else:
        try:
            text = read_text(config_path)
            spec.config = parse_text(text)
        except FileNotFoundError as exc:
            if not autocomplete:  # Triton reads it or fails the poll (its ReadTextProto's words)
                return _poll_failure(spec, f"failed to open text file for read {config_path}: {exc.strerror}")
            # else completed from the model file below, as Triton does
        except OSError as exc:  # a FIFO, a device, a directory, a file too large, permissions
            return _poll_failure(spec, unreadable(config_path, exc))
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            if isinstance(exc, text_format.ParseError) and ProcessLog.settings.log_format in TRITON_FORMATS:
                # Triton's output has its protobuf parser's own line, on stderr as libprotobuf writes it
                # (tritonserver's log format only: Conveyor's says it in the load failure below).
                sys.stderr.write(f"{LIBPROTOBUF_ERROR} Error parsing text-format inference.ModelConfig: "
                                 f"{cpp_parse_error(exc)}\n")
            return _poll_failure(spec, f"failed to parse {config_path}: {exc}")
    config = spec.config
    if not config.name:
        config.name = name
    if not config.platform and not config.backend and not config.default_model_filename and not _guess_backend(path):
        # Triton's last resort (AutoCompleteBackendFields): the backend is the model name's part after its first '.'
        problem = _custom_backend(config, name)
        if problem:  # at Triton's poll (its config normalization)
            return _poll_failure(spec, problem)
    problem = config_problem(config) if text else ""
    if problem:  # Triton validates a config it read before it compares its name with the directory's
        return _poll_failure(spec, f"model '{name}': {problem}")
    if config.name != name:
        return _poll_failure(spec, f"unexpected directory name '{name}' for model '{config.name}', directory name "
                                   "must equal model name")
    spec.backend = _BACKENDS.get(config.platform or config.backend, "")
    pair = _pair_problem(config)
    if pair:
        return _poll_failure(spec, pair)
    if not spec.backend:
        if not config.platform and not config.backend:
            spec.backend = _guess_backend(path)
        if not spec.backend and config.backend:  # Triton looks for its library, and says so
            spec.error = (f"Invalid argument: unable to find backend library for backend '{config.backend}', try "
                          "specifying runtime on the model configuration.")
        elif not spec.backend:
            what = config.platform or config.backend or "(none given)"
            spec.error = f"model '{name}': platform/backend '{what}' is not supported"
            return spec
    if not config.platform and spec.backend == "pytorch" and _is_pt2(config, path):
        config.platform = "torch_aoti"
    if not config.platform and spec.backend in _PLATFORM:
        config.platform = _PLATFORM[spec.backend]
    if not config.platform and spec.backend == "tensorflow":  # savedmodel or graphdef, by its files
        config.platform = frameworks.tensorflow_platform(path)
    if not config.backend and spec.backend != "ensemble":  # Triton reports an ensemble by its platform only
        config.backend = spec.backend
    # Python models complete their own config whenever they define the hook, as in Triton.
    completable = spec.backend != "ensemble"
    if spec.backend == "vllm" and autocomplete:  # whatever the config declares, as Triton's vllm_backend does
        complete_vllm(config)
    if autocomplete and completable and (spec.backend == "python" or not config.input or not config.output):
        _fill_defaults(config)
        _find_versions(spec, quiet=True)
        if spec.versions:
            newest = spec.versions[max(spec.versions)]
            problem = ""
            if spec.backend == "onnxruntime":
                problem = complete_onnx(config, newest, "max_batch_size" in text,
                                        backend_config.default_max_batch_size("onnxruntime"))
            elif spec.backend == "python":
                problem = complete_python(config, newest)
            elif spec.backend in frameworks.COMPLETED:
                problem = frameworks.complete(spec.backend, config, newest, "max_batch_size" in text,
                                              backend_config.default_max_batch_size(spec.backend))
            if problem:
                spec.error = f"model '{name}': {problem}"
                return spec
        spec.versions.clear()
        spec.version_errors.clear()
    problem = validate(config)
    # Triton checks a config's inputs and outputs at its poll only under --strict-model-config; otherwise a
    # config without them fails its load (the backend completes it, or fails).
    incomplete = not config.input or not config.output
    poll_failed = bool(problem) and not (autocomplete and incomplete)
    if not problem and spec.backend == "ensemble":
        problem = ensemble_problem(config)
    why = _NOT_COMPLETED.get(config.platform) or _NOT_COMPLETED.get(spec.backend)
    if problem and why and incomplete:
        problem = f"{problem} ({why})"
    if problem:
        spec.error = f"model '{name}': {problem}"
        spec.poll_failed = poll_failed
        return spec
    _fill_defaults(config)
    backend_config.apply(spec.backend, config)
    _find_versions(spec)
    if config.runtime:
        for v in list(spec.versions):
            problem = runtime_problem(config, spec.path, v)
            if problem:
                del spec.versions[v]
                spec.version_errors[v] = problem
    return spec


def runtime_problem(config: mc.ModelConfig, path: str, version: int) -> str:
    """Triton's refusal of a config's ``runtime`` library (backend_model.cc GetBackendLibraryProperties) that no
    version or model directory holds, or that lies outside the directory it is found in. One found is not loaded
    (Conveyor runs no backend libraries): the backend named runs the model."""
    if config.runtime in ("model.py", f"libtriton_{config.backend}.so"):  # the backend's own (Triton's directory)
        return ""
    search = [os.path.join(path, str(version)), path]
    found = next((d for d in search if os.path.isfile(os.path.join(d, config.runtime))), "")
    if not found:
        where = "".join(f"'{d}' " for d in search)
        return f"unable to find backend library '{config.runtime}' for model '{config.name}', searched: {where}"
    library = os.path.realpath(os.path.join(found, config.runtime))
    if os.path.commonpath([library, os.path.realpath(found)]) != os.path.realpath(found):
        return (f"backend library name '{config.runtime}' escapes backend directory '{found}', for model "
                f"'{config.name}', check model config runtime field")
    return ""


def _custom_backend(config: mc.ModelConfig, name: str) -> str:
    """Triton's rule for a config that names no backend, platform or model file and a model directory without a
    model file it knows: ``<anything>.<backend>`` names the backend (and ``model.<backend>`` its file); '' when it
    does, else Triton's words."""
    if "." not in name:
        return (f"Invalid model name: Could not determine backend for model '{name}' with no backend in model "
                "configuration. Expected model name of the form 'model.<backend_name>'.")
    config.backend = name.split(".", 1)[1]
    config.default_model_filename = f"model.{config.backend}"
    return ""


def _pair_problem(config: mc.ModelConfig) -> str:
    """Triton's refusal of a platform that is not its backend's (ValidateModelConfig): the backend given, or the
    one Triton's normalization names by the default model file when the platform is one it does not know."""
    backend = config.backend or (_FILENAME_BACKEND.get(config.default_model_filename, "")
                                 if config.platform not in _BACKENDS else "")
    if not config.platform or backend not in _TYPED_BACKENDS or config.platform == "ensemble":
        return ""
    if _BACKENDS.get(config.platform) != _BACKENDS[backend]:
        return f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {backend}"
    return ""


def _poll_failure(spec: ModelSpec, error: str) -> ModelSpec:
    spec.error, spec.poll_failed = error, True
    return spec


def _guess_backend(path: str) -> str:
    for root, dirs, files in os.walk(path):
        # A model directory (ONNX with external data: <version>/model.onnx/) counts as its file.
        for f in [*files, *dirs]:
            # A model.py is a Python model, as Triton completes a config without one (L0_backend_python).
            backend = _MODEL_FILE_BACKEND.get(os.path.splitext(f)[1]) or ("python" if f == "model.py" else "")
            if backend:
                return backend
        if root.count(os.sep) - path.count(os.sep) > 1:
            break
    return ""


def _is_pt2(config: mc.ModelConfig, path: str) -> bool:
    """A PyTorch model without a platform is a PyTorch 2 package (torch_aoti) when its file is named
    ``*.pt2``, or when it names none and a version holds ``model.pt2`` but no ``model.pt`` (Triton's
    rule; where Triton would load a named ``.pt2`` as TorchScript, which cannot work, this says AOTI)."""
    if config.default_model_filename:
        return config.default_model_filename.endswith(".pt2")
    for _, version in _version_dirs(path):
        files = set(os.listdir(version))
        if "model.pt" in files:
            return False
        if "model.pt2" in files:
            return True
    return False


def _version_dirs(path: str) -> list[tuple[int, str]]:
    try:
        entries = os.listdir(path)
    except OSError:
        return []
    return sorted((int(e), os.path.join(path, e)) for e in entries
                  if e.isdigit() and os.path.isdir(os.path.join(path, e)))


def _fill_defaults(config: mc.ModelConfig) -> None:
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    ensemble = config.platform == "ensemble"  # Triton names no file for an ensemble, nor for its test backends
    if not config.default_model_filename and config.backend not in TRITON_TEST_BACKENDS and not ensemble:
        config.default_model_filename = (frameworks.default_filename(config)
                                         or ("model.pt2" if config.platform == "torch_aoti" else "")
                                         or _DEFAULT_FILENAME.get(config.backend, "model"))
    if config.HasField("sequence_batching"):  # Triton's defaults, shown by /config
        sb = config.sequence_batching
        if not sb.max_sequence_idle_microseconds:
            sb.max_sequence_idle_microseconds = IDLE_DEFAULT_US
        if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)


# Folders of a model directory that are never versions (Triton's kWarmupDataFolder, kInitialStateFolder,
# kModelConfigFolder).
_NOT_VERSIONS = ("warmup", "initial_state", "configs")
_LEADING_INTEGER = re.compile(r"\s*[+-]?\d+")


def version_dirs(path: str, quiet: bool = False) -> list[int]:
    """The version numbers of ``path``'s folders, as Triton's VersionsToLoad reads them: a name with a
    leading zero is ignored, as is one that does not start with a number (its std::stoll); each with
    Triton's warning (unless ``quiet``)."""
    versions: set[int] = set()
    for entry in sorted(os.listdir(path)):
        if entry in _NOT_VERSIONS or not os.path.isdir(os.path.join(path, entry)):
            continue
        if len(entry) > 1 and entry.startswith("0"):
            if not quiet:
                log.warning("ignore version directory '%s' which contains leading zeros in its directory name",
                            entry)
            continue
        number = _LEADING_INTEGER.match(entry)
        if number is None:
            if not quiet:
                log.warning("ignore version directory '%s' which fails to convert to integral number", entry)
            continue
        versions.add(int(number.group()))
    return sorted(versions)


def _find_versions(spec: ModelSpec, quiet: bool = False) -> None:
    """The versions ``spec``'s version policy loads, with their model files (Triton's VersionsToLoad: a
    version the policy names that has no folder is only logged)."""
    available = version_dirs(spec.path, quiet)
    policy = spec.config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = available
    elif which == "specific":
        chosen = sorted(v for v in set(policy.specific.versions) if v in available)
        if not quiet:
            for v in policy.specific.versions:
                if v not in available:
                    log.error("version %d is specified for model '%s', but the version directory is not present",
                              v, spec.name)
    else:
        n = policy.latest.num_versions
        chosen = available[-n:] if n > 0 else []
    if not chosen:
        spec.error = f"at least one version must be available under the version policy of model '{spec.name}'"
        return
    filename = spec.config.default_model_filename
    if spec.backend == "ensemble":  # an ensemble's version directory holds no file
        spec.versions = {v: os.path.join(spec.path, str(v)) for v in chosen}
        return
    if spec.backend in TRITON_TEST_BACKENDS:  # built in: the version directory is enough, whatever it holds
        # (the path keeps its file part, '' when none is named, so the worker finds the model's directory as
        # for any backend: two levels up)
        spec.versions = {v: os.path.join(spec.path, str(v), filename) for v in chosen}
        return
    for v in chosen:
        file_path = os.path.join(spec.path, str(v), filename)
        # As Triton: an ONNX model may be a directory holding model.onnx and its external data.
        inner = os.path.join(file_path, "model.onnx")
        if spec.backend == "onnxruntime" and os.path.isdir(file_path) and not os.path.isfile(inner):
            spec.version_errors[v] = f"model directory '{file_path}' holds no 'model.onnx'"
        elif os.path.exists(file_path):
            spec.versions[v] = file_path
        else:
            spec.version_errors[v] = f"model file '{file_path}' does not exist"
