#!/usr/bin/env bash
# Regenerate the Python modules for the .proto files in this folder.
#
#   proto/regenerate.sh            (from anywhere; PYTHON=... to pick the interpreter)
#
# Needs grpcio-tools (the `dev` extra: grpcio-tools>=1.71,<1.76, whose bundled
# protoc emits protobuf 6.x gencode). Writes, next to this script:
#   grpc_service_pb2.py grpc_service_pb2.pyi grpc_service_pb2_grpc.py
#   model_config_pb2.py model_config_pb2.pyi
#   health_pb2.py health_pb2.pyi health_pb2_grpc.py
#
# The generated code is then post-processed so that
#   * imports between the modules are package imports
#     (`from conveyor.proto import model_config_pb2 as ...`), and
#   * descriptors are added to the private pool in _pool.py rather than to
#     protobuf's default pool, where tritonclient registers the same symbols.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python}"
PROTOS=(model_config.proto grpc_service.proto health.proto)
WITH_GRPC=(grpc_service health)

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

cd "$HERE"
"$PYTHON" -m grpc_tools.protoc -I. --python_out="$TMP" --pyi_out="$TMP" "${PROTOS[@]}"
for stem in "${WITH_GRPC[@]}"; do
    "$PYTHON" -m grpc_tools.protoc -I. --grpc_python_out="$TMP" "$stem.proto"
done

"$PYTHON" - "$TMP" "$HERE" <<'PY'
import pathlib
import re
import sys

src, dst = (pathlib.Path(p) for p in sys.argv[1:3])
stems = sorted(p.name[: -len(".proto")] for p in dst.glob("*.proto"))
sibling = "|".join(re.escape(s) for s in stems)
# `import model_config_pb2 as x` -> `from conveyor.proto import model_config_pb2 as x`
import_re = re.compile(rf"^import ((?:{sibling})_pb2(?:_grpc)?) as ", re.M)
POOL_IMPORT = "from conveyor.proto import _pool as _conveyor_pool\n"
MARK = "# @@protoc_insertion_point(imports)\n"

for path in sorted(src.iterdir()):
    text = path.read_text()
    text, _ = import_re.subn(r"from conveyor.proto import \1 as ", text)
    if re.search(rf"^import (?:{sibling})_pb2", text, re.M):
        sys.exit(f"{path.name}: a sibling import was left unrewritten")
    if path.name.endswith("_pb2.py"):
        stem = path.name[: -len(".py")]
        n_default = text.count("_descriptor_pool.Default()")
        if n_default != 1 or MARK not in text:
            sys.exit(f"{path.name}: unexpected generated code (Default() x{n_default})")
        text = text.replace("_descriptor_pool.Default()", "_conveyor_pool.POOL")
        text = text.replace(MARK, MARK + POOL_IMPORT, 1)
        # Give the message classes their real module name (pickling, repr).
        text = text.replace(
            f"BuildTopDescriptorsAndMessages(DESCRIPTOR, '{stem}', _globals)",
            f"BuildTopDescriptorsAndMessages(DESCRIPTOR, 'conveyor.proto.{stem}', _globals)",
        )
    (dst / path.name).write_text(text)
    print(f"wrote {dst / path.name}")
PY
