#!/usr/bin/env bash
# The GPU benchmark: the 124M-parameter GPT on one NVIDIA GPU (H100, H200 or A100).
#
#   bash benchmarks/gpu.sh          # from anywhere in the repository
#
# Makes a fresh virtual environment, installs the four workspace packages and
# jax[cuda12] into it, then runs benchmarks/gpu.py: 50 training steps of the trainer
# against the hand-written Flax + optax loop (tokens/s, model FLOPs utilization, the
# train-step ratio) and the tandem-analysis ratio of the validation step. The
# benchmark itself takes a few minutes; the first install downloads about 3 GB.
#
# Environment (all optional):
#   VENV                       where the environment goes (default: /tmp/theseus-gpu-venv)
#   JAX_SPEC                   what to install for JAX (default: jax[cuda12])
#   THESEUS_BENCH_PYTHON       use this Python as it is; make and install nothing
#   THESEUS_BENCH_MODEL        gpt2-124m (default) or tiny (to try it on a CPU with
#                              JAX_PLATFORMS=cpu)
#   THESEUS_BENCH_PEAK_TFLOPS  the device's peak, when gpu.py does not know it
#   CUDA_VISIBLE_DEVICES       which GPU (default: 0; the benchmark uses one device)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
start=$SECONDS

if [[ -n "${THESEUS_BENCH_PYTHON:-}" ]]; then
    python="$THESEUS_BENCH_PYTHON"
else
    venv="${VENV:-/tmp/theseus-gpu-venv}"
    packages=(packages/theseus-store packages/theseus-plot packages/theseus-core packages/theseus-analysis)
    if command -v uv >/dev/null; then
        uv venv --quiet --python 3.11 "$venv"
        uv pip install --quiet --python "$venv/bin/python" "${packages[@]}" "${JAX_SPEC:-jax[cuda12]}"
    else
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --upgrade pip
        "$venv/bin/pip" install --quiet "${packages[@]}" "${JAX_SPEC:-jax[cuda12]}"
    fi
    python="$venv/bin/python"
    echo "environment ready in $((SECONDS - start)) s: $("$python" -c 'import jax; print("jax", jax.__version__, jax.devices())')"
fi

"$python" benchmarks/gpu.py
echo "gpu.sh: $((SECONDS - start)) s in all"
