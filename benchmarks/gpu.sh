#!/usr/bin/env bash
# The GPU benchmark: model FLOPs utilization per training strategy, for the 124M GPT and
# a 1.1B GPT (20 layers x 2048, 16 heads, block 1024), on one NVIDIA GPU (H100, H200 or
# A100; gpu.py itself uses every device JAX sees, so a TPU host's chips too).
#
#   bash benchmarks/gpu.sh [--json PATH]    # from anywhere in the repository
#
# Makes a fresh virtual environment, installs the four workspace packages and
# jax[cuda12] into it, then runs benchmarks/gpu.py (its options pass through): per model,
# the trainer's step with training/strategy = dp (alternating with the hand-written
# Flax + optax loop: 8 rounds of 5 steps per side, and the ratio), zero1 and fsdp (the
# trainer alone: 4 rounds of 5 steps), and for the 1B model dp with training/remat =
# block (4 rounds of 5 steps); tokens/s, TFLOP/s per device and MFU against the peak it
# assumed (and where that came from); then the tandem-analysis ratio of the validation
# step on the 124M model. The runs share a 420 s budget (gpu.py --budget): gpu.sh should
# end within 8 minutes once the environment exists; a run that would start with under
# 45 s left is skipped with a note. The first install downloads about 3 GB.
#
# Environment (all optional):
#   VENV                       where the environment goes (default: /tmp/theseus-gpu-venv)
#   JAX_SPEC                   what to install for JAX (default: jax[cuda12])
#   THESEUS_BENCH_PYTHON       use this Python as it is; make and install nothing
#   THESEUS_BENCH_MODEL        gpt2-124m,gpt-1b (default), some of them, or tiny (two tiny
#                              GPTs, to try it on a CPU with JAX_PLATFORMS=cpu)
#   THESEUS_BENCH_PEAK_TFLOPS  the device's peak, when gpu.py does not know it
#   CUDA_VISIBLE_DEVICES       which GPUs (default: 0, one device; 0,1,... for several)
#   XLA_PYTHON_CLIENT_MEM_FRACTION  of the device's memory JAX may take (gpu.py: 0.92)
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

status=0
"$python" benchmarks/gpu.py "$@" || status=$?  # 1: a run failed or was skipped
echo "gpu.sh: $((SECONDS - start)) s in all"
exit "$status"
