#!/usr/bin/env bash
# The embed bench on a GPU machine, in one short run: residue built with
# `--features cuda` against sentence-transformers on the same GPU.
#
# Prepared off the machine (it has no Rust and no registry):
#   cargo bench --no-run --features cuda --bench embed   (CUDA 13 nvcc, CUDA_COMPUTE_CAP=90)
#   .gpu/embed        the bench binary, stripped
#   .gpu/model/       the model folder without its weights (config, tokenizer,
#                     pooling, modules): the weights are drawn at random here,
#                     which leaves the work per text, hence the rate, unchanged
# Run from the repository root with the machine's python3 (torch,
# transformers, sentence-transformers) on PATH; writes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/residue-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-bench.log") 2>&1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c 'import torch, sentence_transformers as st; print("torch", torch.__version__, "cuda", torch.version.cuda, "st", st.__version__)'

# The CUDA libraries the binary links (cuBLAS, cuRAND, NVRTC, the runtime)
# come with the machine's torch wheels; the driver's libcuda with the driver.
libs=$( (python3 -c 'import site; print("\n".join(site.getsitepackages()))'; echo /usr/local /opt) |
    xargs -I{} find {} -xdev \( -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' -o -name 'libcurand.so.10' -o -name 'libnvrtc.so.13' \) -printf '%h\n' 2>/dev/null |
    sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd .gpu/embed | grep -E 'cuda|cublas|curand|nvrtc|not found'

# Random weights in the model's shapes; the folder's own config is kept.
model=/tmp/residue-model
rm -rf "$model" && cp -r .gpu/model "$model"
python3 - "$model" <<'PY'
import shutil, sys, torch
from transformers import BertConfig, BertModel
d = sys.argv[1]
shutil.copy(f"{d}/config.json", f"{d}/config.keep")
torch.manual_seed(0)
BertModel(BertConfig.from_pretrained(d), add_pooling_layer=False).save_pretrained(d, safe_serialization=True)
shutil.move(f"{d}/config.keep", f"{d}/config.json")
PY
[ -s "$model/model.safetensors" ] || { echo "no random weights were written to $model" >&2; exit 1; }

for batch in 32 256; do
    echo "=== batch $batch"
    RESIDUE_EMBED_MODEL=$model RESIDUE_ST_PYTHON=python3 ST_DEVICE=cuda \
        RESIDUE_ST_SCRIPT="$PWD/benches/st_compare.py" \
        TEXTS=4096 BATCH=$batch ROUNDS=3 RESIDUE_LOG=info timeout 200 .gpu/embed --bench
done
