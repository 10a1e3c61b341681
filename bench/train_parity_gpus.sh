#!/usr/bin/env bash
# Every family of bench/train_parity.py at once, one process per (family, impl, seed), spread over the visible GPUs
# (the longest runs first, each to the least-loaded GPU), then the report. From the repository root, after
# `--prepare-only` with the same inputs and settings (docs/train-parity.md):
#   INPUTS="a.jsonl.xz b.jsonl.xz" NANOGPT=.peers/nanoGPT bash bench/train_parity_gpus.sh
# PYTHON names the interpreter (default python3); ARGS adds train_parity.py options to every run (e.g. ARGS="--compile"; ARGS="--size tiny" for a CPU check).
# FAMILIES="t5 bart" runs those families alone; JOBS=N starts at most N runs at a time (default: all at once).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT_DIR:-runs/parity}; LIMIT=${LIMIT:-1800}; SEEDS=${SEEDS:-"0 1"}; STEPS=${STEPS:-2000}
FAMS=" ${FAMILIES:-gpt2 llama bert roberta electra t5 t5-v1_1 bart} "; JOBS=${JOBS:-0}
DATA=(); [ -n "${INPUTS:-}" ] && DATA=(--data-inputs $INPUTS)
PY=${PYTHON:-python3}
NG=$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))') || {
  echo "error: $PY cannot import torch (PYTHON=.venv/bin/python picks another interpreter)" >&2; exit 2; }
declare -a load; for ((g = 0; g < NG; g++)); do load[g]=0; done
runs() {  # relative cost, family, impl, seed
  for s in $SEEDS; do
    for i in lmforge hf; do echo "9 electra $i $s"; done
    for f in t5 t5-v1_1 bart; do for i in lmforge hf; do echo "7 $f $i $s"; done; done
    for f in bert roberta llama; do for i in lmforge hf; do echo "4 $f $i $s"; done; done
    for i in lmforge hf ${NANOGPT:+nanogpt}; do echo "4 gpt2 $i $s"; done
  done
}
mkdir -p "$O"
while read -r cost f i s; do
  [[ $FAMS == *" $f "* ]] || continue
  while ((JOBS > 0)) && (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
  g=0; for ((k = 1; k < NG; k++)); do ((load[k] < load[g])) && g=$k; done
  load[g]=$((load[g] + cost))
  extra=(); [ "$i" = nanogpt ] && extra=(--nanogpt "$NANOGPT")
  sets=(train.batch_size=16); [[ $f == t5* ]] && sets+=(data.tokenizer_kind=bpe)  # unigram training takes minutes
  CUDA_VISIBLE_DEVICES=$g timeout "$LIMIT" "$PY" bench/train_parity.py --family "$f" --impls "$i" --seeds "$s" \
    --steps "$STEPS" --out "$O" ${ARGS:-} "${DATA[@]}" "${extra[@]}" --set "${sets[@]}" > "$O/$f-$i-$s.log" 2>&1 &
done < <(runs)
wait
"$PY" bench/train_parity.py --report "$O"
