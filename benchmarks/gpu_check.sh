#!/bin/bash
# The library's CUDA path on a GPU machine, in one go (the sessions' device check):
#   1. tests/policy/test_gpu.py (the `gpu` marker: policies, encoders, the main job, a bf16 LoRA VLM);
#   2. benchmarks/bench_paper_size.py on CUDA (the paper's sizes: memory, update and sampling speed);
#   3. benchmarks/bench_vlm_size.py --measure (one LoRA update of Qwen2-VL-2B / -7B at real size).
# Packages the machine lacks travel as wheels in .whl/ (see the note on issue 32). Results go to
# $OUT (default: runs/gpu_check/).
set -o pipefail
OUT=${OUT:-runs/gpu_check}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$OUT/machine.txt"
python3 -c "import torch, transformers, datasets, peft, accelerate, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'datasets', datasets.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__)" 2>&1 | tee -a "$OUT/machine.txt"
timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider tests/policy/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
timeout ${T_PAPER:-150} python3 benchmarks/bench_paper_size.py --set device=cuda --vit \
  --out "$OUT/paper_size_cuda.json" 2>&1 | tee "$OUT/paper_size.log"
timeout ${T_VLM:-100} python3 benchmarks/bench_vlm_size.py --measure --batch 16 \
  --json "$OUT/vlm_size_cuda.json" 2>&1 | tee "$OUT/vlm_size.log"
echo "done"
