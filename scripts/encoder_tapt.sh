#!/usr/bin/env bash
# Does the pretrained encoder help on sentiment? The rotary RoBERTa-style encoder of scripts/finetune_study.sh,
# pretrained on the real corpus, then (task-adaptive pretraining, Gururangan et al. 2020) MLM continued on the
# sentiment set's training texts only (`--run.init`); both fine-tuned (mean pooling) against the random-init encoder
# ([CLS] pooling), each with every seed of SEEDS. One GPU, ~8 minutes. Inputs as scripts/finetune_study.sh.
# Output: one JSON line per fine-tuning run in $OUT/tapt.jsonl.
set -euo pipefail
CORPUS=${CORPUS:-.cache/gpu/corpus} TOK=${TOK:-.cache/gpu/tok} OUT=${OUT:-runs/tapt} W=${W:-/tmp/tapt}
PRESET=${PRESET:-roberta-small-rope} STEPS=${STEPS:-2000} TAPT_STEPS=${TAPT_STEPS:-600} SEEDS=${SEEDS:-"0 1"}
read -r -a FT_EXTRA <<< "${FT_EXTRA:-}"
mkdir -p "$OUT" "$W"
lm() { python -m lmforge.cli "$@"; }
SENT=$(python -c "from lmforge.tasks.readers import BUNDLED_DIR; print(BUNDLED_DIR / 'sentiment')")

lm data prepare "$CORPUS" --out "$W/data" --tokenizer "$TOK" --val-fraction 0.01
lm pretrain roberta --run.dir="$W/bert" --model.preset="$PRESET" --model.vocab_size=16384 --data.tokenizer="$TOK" \
  --data.prepared="$W/data" --train.seq_len=512 --train.batch_size=64 --train.lr=1e-3 --train.warmup_steps=100 \
  --train.max_steps="$STEPS" --train.save_every="$STEPS" --train.eval_every=1000 --train.eval_batches=20 \
  --train.log_every=200 ${COMPILE:---train.compile} | tail -2
cp "$W/bert/metrics.jsonl" "$OUT/pretrain.jsonl"
# Task-adaptive pretraining: the training split's texts only (never dev or test).
lm data prepare "$SENT/train.jsonl.xz" --out "$W/tapt-data" --tokenizer "$TOK" --val-fraction 0.05
lm pretrain roberta --run.dir="$W/tapt" --run.init="$W/bert" --data.prepared="$W/tapt-data" --train.seq_len=128 \
  --train.batch_size=64 --train.lr=1e-4 --train.warmup_steps=60 --train.max_steps="$TAPT_STEPS" \
  --train.save_every="$TAPT_STEPS" --train.eval_every="$TAPT_STEPS" --train.log_every=100 | tail -2
cp "$W/tapt/metrics.jsonl" "$OUT/tapt_pretrain.jsonl"

ft() {  # name init format seed
  local name=$1-s$4
  lm finetune sst2-bert --init "$2" --run.dir="$W/ft-$name" --model.preset="$PRESET" --model.tokenizer="$TOK" \
    --task.format="$3" --run.seed="$4" --train.lr=1e-4 --train.epochs=3 "${FT_EXTRA[@]}" > "$W/ft-$name.log" 2>&1 \
    || { echo "$name failed: $(tail -1 "$W/ft-$name.log")"; return; }
  python - "$name" "$W/ft-$name" >> "$OUT/tapt.jsonl" <<'PY'
import json, sys, pathlib
name, run = sys.argv[1], pathlib.Path(sys.argv[2])
print(json.dumps({"run": name, "dev": json.loads((run / "eval.json").read_text()),
                  "test": json.loads((run / "eval_test.json").read_text())}))
PY
  tail -1 "$OUT/tapt.jsonl"
}
for seed in $SEEDS; do
  ft tapt-mean "$W/tapt" encoder_mean "$seed" &
  ft pre-mean "$W/bert" encoder_mean "$seed" &
  ft scratch-cls none bert "$seed" &
  wait
done
