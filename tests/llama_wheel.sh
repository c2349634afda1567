#!/usr/bin/env bash
# Builds the pinned llama-cpp-python once, for any x86-64 CPU of this project's machines, and prints the
# wheel's path. Every place that needs llama.cpp (tests/setup.sh, the benchmarks, deploy/) installs this
# wheel, never one pip picked from its own cache.
#
# Why it exists:
# - llama.cpp's default build (GGML_NATIVE=ON) compiles for the build machine's own CPU. On a virtual
#   machine that advertises AMX or AVX-512 without letting a process use them, the model then dies on its
#   first matrix product (SIGILL on `tilezero`), and a wheel built on one machine crashes on the next.
#   The flags below fix one baseline that every machine of this kind runs: AVX2, FMA, F16C, BMI2 (x86-64-v3),
#   no AVX-512, no AMX. llama.cpp's runtime dispatch (GGML_BACKEND_DL with GGML_CPU_ALL_VARIANTS) is not used:
#   it chooses its variant from what the CPU reports, so it would choose AMX exactly where AMX faults.
# - pip's wheel cache is keyed by the source distribution alone, not by CMAKE_ARGS: a native wheel built
#   earlier would be reused silently. So pip's cache is bypassed (--no-cache-dir), and the wheel goes to a
#   folder named after everything that shapes the binary (version, flags, compiler, Python tag, machine).
#
# Usage: tests/llama_wheel.sh PYTHON        prints the wheel's path (builds it first if it is not there)
#        tests/llama_wheel.sh --flags       prints the CMake flags
# Environment: CONSTRAINTD_WHEELS (default ~/.cache/constraintd/wheels), the cache of built wheels.
set -euo pipefail

VERSION=0.3.36
FLAGS=(
  -DLLAVA_BUILD=OFF              # the multimodal library: not needed, a quarter of the compile
  -DGGML_NATIVE=OFF              # never -march=native
  -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF
  -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
if [ "${1:-}" = --flags ]; then
  echo "${FLAGS[*]}"
  exit 0
fi
python="${1:?usage: tests/llama_wheel.sh PYTHON | --flags}"

compiler="$( (c++ --version 2>/dev/null || echo none) | head -n 1)"
tag="$("$python" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')"
key="$(printf '%s\n' "$VERSION" "${FLAGS[*]}" "$compiler" "$tag" | sha256sum | cut -c1-16)"
root="${CONSTRAINTD_WHEELS:-$HOME/.cache/constraintd/wheels}"
dir="$root/llama-cpp-python-$VERSION-$tag-$key"

wheel="$(ls "$dir"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
  echo "[llama.cpp] building llama-cpp-python $VERSION for a portable x86-64 baseline (AVX2, no AVX-512, no AMX);" \
       "about six minutes on two cores, once per machine" >&2
  mkdir -p "$root"
  work="$(mktemp -d "$root/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  # --no-binary: compile from the source distribution even where a binary wheel is offered.
  CMAKE_ARGS="${FLAGS[*]}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$python" -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
    --wheel-dir "$work" "llama-cpp-python==$VERSION" >&2
  built="$(ls "$work"/llama_cpp_python-"$VERSION"-*.whl)"
  printf '%s\n' "version $VERSION" "flags ${FLAGS[*]}" "compiler $compiler" "python $tag" > "$work/BUILD-INFO"
  chmod 755 "$work"
  rm -rf "$dir"
  mv "$work" "$dir"
  trap - EXIT
  wheel="$dir/$(basename "$built")"
  echo "[llama.cpp] built $wheel" >&2
fi
echo "$wheel"
