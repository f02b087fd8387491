#!/bin/bash
# The checks that need a CUDA GPU, in one go (CI has none): the GPU tests (CUDA against CPU numbers, runs that
# repeat to the bit, --estimate on a GPU, chunks sized from mem_get_info, bfloat16 within tolerance), which backend is
# fastest there, the FLOP/s the engine reaches against the GPU's peak (float32 and bfloat16), and fig5's cost at full
# size on the GPU.
# Run from the repository root on a machine with a GPU and torch; logs go to ${OUT:-gpu-check}/.
# Where pydantic is missing, put its wheels in .whl/ first (they are installed into /tmp/site).
set -u
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
python3 -c "import torch, pydantic; print('torch', torch.__version__, 'pydantic', pydantic.__version__, torch.cuda.get_device_name())"
timeout "${TESTS_S:-240}" python3 -m pytest -p no:cacheprovider -q -rs \
    tests/engine/test_device.py tests/cli/test_main_estimate.py -k "cuda or gpu" 2>&1 | tee "$OUT/tests.log" | tail -40
timeout "${FLOPS_S:-120}" python3 -m fedhet bench --device cuda --quick 2>&1 | tee "$OUT/flops.md" | tail -12
timeout "${FLOPS_S:-120}" python3 -m fedhet bench --device cuda --quick --precision bfloat16 2>&1 | tee "$OUT/flops-bf16.md" | tail -12
timeout "${BACKENDS_S:-150}" python3 benchmarks/gpu_backends.py --reps 5 --out "$OUT/gpu_backends.md" 2>&1 | tail -20
timeout "${FIG5_S:-240}" python3 -m fedhet reproduce fedgsnr-fig5 --estimate --device cuda 2>&1 | tee "$OUT/fig5.log" | tail -30
