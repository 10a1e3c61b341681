#!/usr/bin/env bash
# Does pretraining help? (GPT-1 Table 5 style) — pretrain a small GPT and a small RoBERTa-style encoder on a real
# corpus, then fine-tune each on the sentiment set and on Bible paraphrase pairs, against the same architectures
# from random init, and GPT without the auxiliary LM loss (λ = 0), each with every seed of SEEDS (TASKS picks the
# labelled sets; JOBS fine-tunes share the GPU at a time; `python scripts/seed_table.py $OUT/study.jsonl` averages
# them over seeds). One GPU, ~8 minutes with the defaults.
#
# Inputs (built on a machine with registry access; see the closing note of the fine-tuning issue):
#   CORPUS  dir of *.jsonl(.xz) documents    TOK  tokenizer dir (byte-level BPE, bart specials)
#   PARA    labelled dir (train/dev/test.jsonl + meta.json) of paraphrase pairs
# Output: one JSON line per fine-tuning run in $OUT/study.jsonl, pretraining metrics in $OUT/*_pretrain.jsonl.
set -euo pipefail
CORPUS=${CORPUS:-.cache/gpu/corpus} TOK=${TOK:-.cache/gpu/tok} PARA=${PARA:-.cache/gpu/para}
OUT=${OUT:-runs/study} STEPS=${STEPS:-1200} B=${B:-64} SEQ=${SEQ:-512} W=${W:-/tmp/study}
MODELS=${MODELS:-"gpt bert"} INITS=${INITS:-"pretrained scratch"}
BERT_STEPS=${BERT_STEPS:-2000} BERT_LR=${BERT_LR:-1e-3}
BERT_PRESET=${BERT_PRESET:-roberta-small-rope}  # or roberta-small: learned positions, post-LN
SEEDS=${SEEDS:-0} TASKS=${TASKS:-"sentiment paraphrase"} JOBS=${JOBS:-1}
read -r -a FT_EXTRA <<< "${FT_EXTRA:-}"  # e.g. "--data.max_train=64 --data.max_eval=32" for a dry run
mkdir -p "$OUT" "$W"
source "$(dirname "$0")/study_common.sh"

lm data prepare "$CORPUS" --out "$W/data" --tokenizer "$TOK" --val-fraction 0.01
common=(--data.tokenizer="$TOK" --data.prepared="$W/data" --model.vocab_size=16384 --train.seq_len="$SEQ"
        --train.batch_size="$B" --train.warmup_steps=100 --train.eval_every=400
        --train.eval_batches=20 --train.log_every=100 ${COMPILE:---train.compile})
has() { [[ " $MODELS " == *" $1 "* ]]; }
if has gpt; then
  lm pretrain gpt --run.dir="$W/gpt" --model.preset=gpt-small --train.lr=6e-4 --train.max_steps="$STEPS" \
    --train.save_every="$STEPS" "${common[@]}" | tail -3
  cp "$W/gpt/metrics.jsonl" "$OUT/gpt_pretrain.jsonl"
fi
if has bert; then
  lm pretrain roberta --run.dir="$W/bert" --model.preset="$BERT_PRESET" --train.lr="$BERT_LR" \
    --train.max_steps="$BERT_STEPS" --train.save_every="$BERT_STEPS" "${common[@]}" | tail -3
  cp "$W/bert/metrics.jsonl" "$OUT/bert_pretrain.jsonl"
fi

ft() {  # name recipe init data-overrides... ; records eval.json (dev) and eval_test.json
  local name=$1 recipe=$2 init=$3; shift 3
  lm finetune "$recipe" --init "$init" --run.dir="$W/ft-$name" --model.tokenizer="$TOK" --train.lr=1e-4 \
    --train.epochs=3 "${FT_EXTRA[@]}" "$@" > "$W/ft-$name.log" 2>&1 \
    || { echo "$name failed: $(tail -1 "$W/ft-$name.log")"; return; }
  record "$name" "$W/ft-$name" >> "$OUT/study.jsonl"
  tail -1 "$OUT/study.jsonl"
}
para=(--data.source=dir --data.dir="$PARA" --data.max_train=10000)
for seed in $SEEDS; do
  sfx=$([ "$seed" = 0 ] || echo "-s$seed")  # seed 0 keeps the names of single-seed runs
  for task in $TASKS; do
    if [ "$task" = sentiment ]; then
      gpt=(sst2-gpt) bert=(sst2-bert --task.format=bert)
    else
      gpt=(glue-mrpc "${para[@]}") bert=(glue-mrpc "${para[@]}")
    fi
    for init in $INITS; do
      g=$W/gpt b=$W/bert
      [ "$init" = scratch ] && g=none b=none
      has gpt && queue ft "gpt-$task-$init$sfx" "${gpt[0]}" "$g" --model.preset=gpt-small --run.seed="$seed" \
        "${gpt[@]:1}"
      has bert && queue ft "bert-$task-$init$sfx" "${bert[0]}" "$b" --model.preset="$BERT_PRESET" --run.seed="$seed" \
        "${bert[@]:1}"
    done
    has gpt && queue ft "gpt-$task-pretrained-lambda0$sfx" "${gpt[0]}" "$W/gpt" --task.lm_coef=0 --run.seed="$seed" \
      "${gpt[@]:1}"
  done
done
wait
