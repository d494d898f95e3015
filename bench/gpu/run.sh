#!/usr/bin/env bash
# Kronk's GPU checks, on the GPU machine, from the root of the checkout, with the GPU kit's
# bundle in .gpu (built on your machine by `KIT_WORKTREE=1 bash ../shared/gpu-kit/prepare.sh`,
# then `bash bench/gpu/extra_wheels.sh`) and, where it was built, llama.cpp for CUDA in
# .gpu-libs (`python bench/gpu/cuda_bundle.py`; carry both):
#   0. .gpu-libs/llama-cuda.tar.xz unpacked into /tmp/llama-build/bin with the kit's stamp,
#      so that the kit takes it for its own build instead of building for about 4 minutes;
#   1. the kit's build and preparation, no kit bench: llama.cpp for CUDA with llama-server and
#      llama-batched-bench in /tmp/llama-build, the project's wheels in /tmp/site, the
#      random-weight 1.24B model in /tmp/kronk-bench (a warm machine reuses all of it);
#   2. exact: tests/test_engine_overlap.py on CUDA (overlapped decoding and device sampling
#      against the host engine, and a cached conversation against a cold replay);
#   3. load: bench/gpu/load_order.py, the load crash case by case (import order, bindings);
#   4. bench: bench/bench_gpu.py, engine vs llama-batched-bench, per-step split, servers.
# Results in $OUT: kit/ (the kit's log), exactness.txt, load_order.txt, symbols.txt,
# bench_gpu.json/.txt. Knobs: DEADLINE (s, default 560), KIT (bundle folder), PARTS
# (exact,bench; load too where asked), BENCH_ARGS.
set -u -o pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIT="${KIT:-$ROOT/.gpu}"
OUT="${OUT:-/tmp/gpu-out}"
DEADLINE="${DEADLINE:-560}"
PARTS="${PARTS:-exact,bench}"
T0=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
mkdir -p "$OUT/kit"

# 0. The libraries built beforehand; the host's CUDA libraries where the loader finds them
#    (the bundle names them by soname only).
LIBS_BUNDLE="${LIBS_BUNDLE:-$ROOT/.gpu-libs/llama-cuda.tar.xz}"
if ! command -v nvcc >/dev/null; then  # where the kit looks for it too
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/cuda/bin /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu*/bin; do
    [[ -x "$d/nvcc" ]] && { export PATH="$d:$PATH"; break; }
  done
fi
NVCC_BIN="$(command -v nvcc || true)"
if [[ -n "$NVCC_BIN" ]]; then  # NVIDIA's installer puts the libraries in lib64, PyPI's in lib
  CUDA_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC_BIN")")")"
  export LD_LIBRARY_PATH="$CUDA_ROOT/lib64:$CUDA_ROOT/lib:$CUDA_ROOT/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
fi
if [[ -f "$LIBS_BUNDLE" && "${FORCE_BUILD:-0}" != 1 && ! -f /tmp/llama-build/bin/libllama.so ]]; then
  mkdir -p /tmp/llama-build/bin && tar -xJf "$LIBS_BUNDLE" -C /tmp/llama-build/bin
  # The kit reuses a build whose stamp is its llama.cpp version and this host's nvcc.
  echo "$(grep -m1 '^llama-cpp-python' "$KIT/VERSION" 2>/dev/null) / $(nvcc --version 2>/dev/null | tail -1)" \
    > /tmp/llama-build/.kronk-stamp
  echo "llama.cpp for CUDA from $LIBS_BUNDLE ($(( $(date +%s) - T0 )) s); unresolved:" \
    "$(ldd /tmp/llama-build/bin/libggml-cuda.so | grep -c 'not found')"
fi

# 1. Build and prepare with the kit; it keeps 10 s for itself after the build.
BENCHES=none DEADLINE=$(( DEADLINE - 200 )) OUT="$OUT/kit" bash "$KIT/run.sh" > "$OUT/kit/run.txt" 2>&1
tail -n 25 "$OUT/kit/run.txt"
BIN=/tmp/llama-build/bin
MODEL=/tmp/kronk-bench/bench1b-q8_0.gguf
[[ -f "$BIN/libllama.so" && -s "$MODEL" ]] || { echo "build or model missing: see $OUT/kit"; exit 1; }

export PYTHONPATH="/tmp/site:$KIT/py:$ROOT/bench:$ROOT/scripts"
export LLAMA_CPP_LIB_PATH="$BIN" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
echo "kronk from: $(python3 -c 'import kronk_core; print(kronk_core.__file__)')"

# Which C++ runtime symbols each llama.cpp library defines too (candidates for capture).
STDCXX=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')
nm -D --defined-only "$STDCXX" | awk '{print $3}' | sed 's/@.*//' | sort -u > /tmp/stdcxx.defs
for lib in "$BIN"/lib*.so; do
  nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u \
    | comm -12 - /tmp/stdcxx.defs | c++filt | sed "s|^|$(basename "$lib"): |"
done > "$OUT/symbols.txt"
echo "libstdc++ ($STDCXX) symbols also defined by llama.cpp's libraries: $(wc -l < "$OUT/symbols.txt")"
for lib in "$BIN"/libllama.so "$BIN"/libggml*.so; do
  echo "$(basename "$lib") needs: $(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
done
if [[ -f /tmp/llama-build/CMakeCache.txt ]]; then  # built here, not unpacked
  grep -E "^CMAKE_CXX_COMPILER:|^CMAKE_(CXX|SHARED_LINKER)_FLAGS(_RELEASE)?:" /tmp/llama-build/CMakeCache.txt
  CXX_USED=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' /tmp/llama-build/CMakeCache.txt)
  echo "static runtime in $CXX_USED's specs: $("$CXX_USED" -dumpspecs 2>/dev/null | grep -c static-libstdc); env: CXXFLAGS=${CXXFLAGS:-} LDFLAGS=${LDFLAGS:-}"
fi
cut -d: -f1 "$OUT/symbols.txt" | sort | uniq -c

if [[ ",$PARTS," == *",exact,"* ]]; then
  echo "######## exactness on CUDA ($(left) s left)"
  KRONK_OVERLAP_MODEL="$MODEL" KRONK_OVERLAP_TEMPLATE=chatml \
    timeout -k 5 $(( $(left) - 200 > 100 ? 100 : ($(left) - 200 > 30 ? $(left) - 200 : 30) )) \
    python3 -m pytest --noconftest -p no:cacheprovider -q --rootdir "$ROOT" \
    "$ROOT/tests/test_engine_overlap.py" 2>&1 | tee "$OUT/exactness.txt" | tail -n 40
fi
if [[ ",$PARTS," == *",load,"* ]]; then
  echo "######## load order ($(left) s left)"
  timeout -k 5 $(( $(left) - 150 > 200 ? 200 : ($(left) - 150 > 30 ? $(left) - 150 : 30) )) python3 "$ROOT/bench/gpu/load_order.py" "$MODEL" \
    | tee "$OUT/load_order.txt"
fi
if [[ ",$PARTS," == *",bench,"* ]]; then
  echo "######## bench_gpu ($(left) s left)"
  timeout -k 5 $(( $(left) - 5 )) python3 "$ROOT/bench/bench_gpu.py" "$MODEL" --llama-bin "$BIN" \
    --json "$OUT/bench_gpu.json" --timeout 120 ${BENCH_ARGS:-} | tee "$OUT/bench_gpu.txt"
fi
echo "TOTAL: $(( $(date +%s) - T0 )) s"
