#!/usr/bin/env bash
# GPU checks of train.parallel=fsdp that CPU tests cannot make (run from the repository root on >= 2 GPUs):
#  1. gpt2-124m on 2 GPUs with compiled blocks, activation checkpointing and async sharded saves;
#  2. the same run resumed from its step-20 checkpoint on 1 GPU (resharding 2 -> 1): steps 25 and 30 should log
#     the losses of the uninterrupted run to bf16 noise (|difference| well under 0.05);
#  3. 10 steps with CPU offload on 2 GPUs;
#  4. the sharded run converted to a Hugging Face model: transformers' logits equal lmforge's (fp32, CPU).
# Usage: bash bench/fsdp_check.sh [WORK_DIR]   (logs and metrics are copied to $OUT when it is set)
set -euo pipefail
W=${1:-/tmp/fsdp-check}
OUT=${OUT:-$W}
export PYTHONPATH=src OMP_NUM_THREADS=8
mkdir -p "$W" "$OUT"
python - "$W" <<'EOF'
import sys
sys.path.insert(0, "bench")
import scale
print("corpus:", scale.prepared_corpus(scale.parse_args(["--work", sys.argv[1]])))
EOF
C=(--data.tokenizer="$W/corpus/tok" --data.prepared="$W/corpus/data" --model.preset=gpt2-124m --model.vocab_size=50257
   --train.seq_len=1024 --train.log_every=5 --train.eval_batches=1 --train.warmup_steps=10 "--sample.prompts=[]")
R=$W/compiled
rm -rf "$R" "$W/offload" "$W/hf"
echo "== 1. 2 GPUs: fsdp + compile + activation checkpointing + async_save"
torchrun --nproc_per_node=2 -m lmforge.cli pretrain gpt "${C[@]}" --run.dir="$R" --train.batch_size=8 \
  --train.max_steps=30 --train.save_every=10 --train.parallel=fsdp --train.compile \
  --train.activation_checkpointing --train.async_save 2>&1 | grep -v "^W" | tail -4
ls "$R/checkpoints" "$R/checkpoints/step_30/dcp"
cp "$R/metrics.jsonl" "$OUT/fsdp-check-2gpu.jsonl"
rm -r "$R/checkpoints/step_30"
echo "== 2. resume the step-20 checkpoint on 1 GPU (global batch 16 kept)"
python -m lmforge.cli pretrain gpt --run.dir="$R" --resume --train.batch_size=16 --train.compile=false 2>&1 | tail -3
cp "$R/metrics.jsonl" "$OUT/fsdp-check-resumed-1gpu.jsonl"
python - "$OUT" <<'EOF'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a = losses(f"{sys.argv[1]}/fsdp-check-2gpu.jsonl")
b = losses(f"{sys.argv[1]}/fsdp-check-resumed-1gpu.jsonl")
for s in (25, 30):
    print(f"step {s}: 2 GPUs {a[s]:.4f}, resumed on 1 GPU {b[s]:.4f}, difference {abs(a[s] - b[s]):.4f}")
EOF
echo "== 3. 2 GPUs: fsdp + cpu_offload"
torchrun --nproc_per_node=2 -m lmforge.cli pretrain gpt "${C[@]}" --run.dir="$W/offload" --train.batch_size=8 \
  --train.max_steps=10 --train.save_every=10 --train.parallel=fsdp --train.cpu_offload 2>&1 | grep -v "^W" | tail -3
echo "== 4. convert the sharded run and compare logits with transformers"
python -m lmforge.cli convert "$R" --to hf --out "$W/hf"
HF_HUB_OFFLINE=1 python - "$R" "$W/hf" <<'EOF'
import sys, torch, transformers, lmforge
ours, _ = lmforge.load(sys.argv[1])
theirs = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
ids = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    print(f"max |logits difference| lmforge vs transformers: {(ours(ids).logits - theirs(ids).logits).abs().max():.2e}")
EOF
