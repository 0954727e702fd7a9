#!/usr/bin/env bash
# Gather, HERE, the x86-64 cp312 wheels the GPU machine lacks for Conveyor and its GPU
# tests into .whl/ (ignored by git; the device tool carries it: `carry: [".whl"]`).
# Then, on the device machine: `bash deploy/gpu/check.sh` (docs/GPU.md, "The GPU check in one call"),
# and `bash deploy/gpu/measure.sh` (the request path measured there), which also needs the perf_analyzer
# this packs into .whl/perf_analyzer.tar.xz.
#
# What the machine already has (/work/.library/device/KINDS.md) is not fetched: numpy, torch (CUDA),
# cupy-cuda13x, cuda-bindings (what tritonclient's cuda_shared_memory imports), nvidia-ml-py, onnx,
# onnxruntime (CPU), aiohttp, uvloop, h11, click, certifi, urllib3, packaging, ml-dtypes, pytest-timeout,
# pyyaml. A few it has are carried anyway, because their version there is unknown and ours matters:
# protobuf (proto/ is protobuf 6 gencode), grpcio (tritonclient needs >= 1.81.1), pytest + pluggy + iniconfig (pytest-asyncio
# 1.x needs >= 8.2). Installed with --target, they shadow the machine's copies for this check only.
#
# Usage: bash deploy/gpu/bundle.sh   (MAX_MIB=40 by default; the whole tree that travels must stay <= 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=.whl
MAX_MIB=${MAX_MIB:-40}
PY=${PYTHON:-python3}

# NAME==VERSION, the versions the project's own environment runs (and CI tests) today.
WHEELS=(
  pyzmq==27.3.0 msgspec==0.22.0 orjson==3.13.0 posix-ipc==1.3.2
  falcon==4.4.0 uvicorn==0.54.0 httptools==0.9.0 h2==4.4.1 hyperframe==6.1.0 hpack==4.2.0 ngh2==0.3.0
  grpcio==1.85.3 protobuf==6.33.6
  tritonclient==2.73.0 python-rapidjson==1.25
  geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 brotli==1.2.1
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-asyncio==1.5.0
)
# pip matches manylinux tags exactly: name every glibc level a wheel of these may carry (the machine's is 2.39).
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
           manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done

mkdir -p "$DEST"
# One version of each: two stop the whole install there. Drop wheels no longer pinned.
keep=" "
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}
  keep+="$(echo "$name" | tr 'A-Z-.' 'a-z__') "
done
for f in "$DEST"/*.whl; do
  [ -e "$f" ] || continue
  base=$(basename "$f"); norm=$(echo "${base%%-*}" | tr 'A-Z-.' 'a-z__')
  ver=$(echo "$base" | cut -d- -f2)
  pinned=""
  for spec in "${WHEELS[@]}"; do
    n=$(echo "${spec%%==*}" | tr 'A-Z-.' 'a-z__')
    [ "$n" = "$norm" ] && pinned=${spec##*==}
  done
  if [ -z "$pinned" ] || [ "$pinned" != "$ver" ]; then echo "removing $base (not pinned)"; rm -f "$f"; fi
done

for spec in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    "${PLATFORMS[@]}" --platform any -d "$DEST" "$spec" 2> >(grep -v "^WARNING: Location" >&2) \
    || { echo "bundle.sh: no cp312 x86-64 wheel of $spec" >&2; exit 1; }
done

# perf_analyzer for deploy/gpu/measure.sh: the 2.51 binary (as ../shared/tools/install-perf-analyzer
# makes it) with the two libraries it needs beyond the machine's own, xz-compressed (20 MiB -> 5).
PA=${PA_DIR:-.cache/perf_analyzer}
if [ ! -x "$PA/perf_analyzer.bin" ]; then
  bash ../shared/tools/install-perf-analyzer "$PA" >&2 || echo "bundle.sh: no perf_analyzer: measure.sh will not run" >&2
fi
if [ -x "$PA/perf_analyzer.bin" ]; then
  stage=$(mktemp -d)
  mkdir -p "$stage/lib"
  cp "$PA/perf_analyzer.bin" "$stage/"
  cp "$(find "$PA/venv" -name 'libcudart.so.12' | head -1)" "$stage/lib/"
  cp "$(ldconfig -p | awk '/libb64.so.0d/ {print $NF; exit}')" "$stage/lib/"
  tar -C "$stage" -cJf "$DEST/perf_analyzer.tar.xz" perf_analyzer.bin lib
  rm -rf "$stage"
fi

# The frameworks for check.sh's CPU smoke run (FIL's and OpenVINO's tests on that machine's 16 cores),
# in .whl/frameworks/ (installed by check.sh alone). OpenVINO's wheel is 59 MiB: it travels as its CPU
# part only (the CPU plugin, the IR and ONNX readers; no GPU/NPU plugins or other frontends), 21 MiB of
# xz. TensorFlow (tensorflow-cpu, 270 MiB) cannot travel: its tests skip there.
FW=$DEST/frameworks
FW_WHEELS=(xgboost-cpu==3.2.0 lightgbm==4.7.0 treelite==4.8.1 openvino-telemetry==2025.2.0)
OPENVINO=openvino==2026.4.1
mkdir -p "$FW"
for spec in "${FW_WHEELS[@]}"; do
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    "${PLATFORMS[@]}" --platform any -d "$FW" "$spec" 2> >(grep -v "^WARNING: Location" >&2) \
    || { echo "bundle.sh: no cp312 x86-64 wheel of $spec" >&2; exit 1; }
done
if [ ! -s "$FW/openvino-cpu.tar.xz" ]; then
  stage=$(mktemp -d)
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 "${PLATFORMS[@]}" -d "$stage" "$OPENVINO" \
    2> >(grep -v "^WARNING: Location" >&2)
  (cd "$stage" && unzip -q openvino-*.whl && rm -rf openvino-*.whl openvino/include \
     openvino/libs/cache.json openvino/libs/libopenvino_intel_{gpu,npu}_plugin.so \
     openvino/libs/libopenvino_{gguf,jax,paddle,pytorch,tensorflow,tensorflow_lite}_frontend.so.*)
  tar -C "$stage" -cf - . | xz -T2 -6 > "$FW/openvino-cpu.tar.xz"
  rm -rf "$stage"
fi
fw=$(du -cb "$FW"/* | tail -1 | cut -f1)

total=$(du -cb "$DEST"/*.whl "$DEST"/perf_analyzer.tar.xz 2>/dev/null | tail -1 | cut -f1)
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
untracked=${untracked:-0}
mib() { echo "$(( ($1 + 1048575) / 1048576 ))"; }
ls -1 "$DEST"/*.whl "$DEST"/perf_analyzer.tar.xz 2>/dev/null | sed 's|.*/||'
echo "bundle: $(ls "$DEST"/*.whl | wc -l) wheels, $(mib "$total") MiB (limit ${MAX_MIB} MiB);" \
     "tracked tree $(mib "$tree") MiB, untracked-not-ignored $(mib "$untracked") MiB;" \
     "frameworks $(mib "$fw") MiB; travels: $(mib $((total + fw + tree + untracked))) MiB of 64"
if [ "$total" -gt $((MAX_MIB << 20)) ]; then
  echo "bundle.sh: the bundle is over ${MAX_MIB} MiB" >&2; exit 1
fi
if [ $((total + fw + tree + untracked)) -gt $((64 << 20)) ]; then
  echo "bundle.sh: working tree + bundle is over the device tool's 64 MiB" >&2; exit 1
fi
