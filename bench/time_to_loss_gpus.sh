#!/usr/bin/env bash
# Time to loss on several corpora at once: for each prepared GPT-2-BPE data dir, one GPU runs nanoGPT's 1,200-step
# recipe and then every gpt-fast variant (bench/train_e2e.py --time-to-loss), all on that corpus's validation windows.
# From the repository root:
#   NANOGPT=.peers/nanoGPT OUT_DIR=runs/ttl bash bench/time_to_loss_gpus.sh DATA_DIR... -- "--train.time_budget=30" ...
# Each string after -- is one gpt-fast variant (default: the recipe as it is). Results: OUT_DIR/<corpus>.json, logs
# and runs under OUT_DIR/<corpus>/. GPU0=N starts at GPU N (two invocations can share a host). With fewer GPUs than
# corpora, each GPU runs its corpora one after another.
# PYC=DIR caches every process's Python bytecode in DIR, written by one untimed warm-up on the first corpus
# (nanoGPT for 30 iterations, gpt-fast for 8 s) before any timed process, as an installed Python has its .pyc
# files. Without it, a Python that writes no bytecode (PYTHONDONTWRITEBYTECODE) compiles torch's sources again in
# every process, seconds of each side's wall time. Every timed process starts with empty inductor caches either way.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
O=${OUT_DIR:-runs/ttl}; PY=${PYTHON:-python3}
dirs=(); while (($#)) && [ "$1" != "--" ]; do dirs+=("$1"); shift; done; (($#)) && shift
variants=(); for v in "$@"; do variants+=("--fast-args=$v"); done
NG=$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))')
mkdir -p "$O"
: "${NANOGPT:?set NANOGPT to a nanoGPT checkout}"
g0=${GPU0:-0}  # the first GPU to use
if [ -n "${PYC:-}" ]; then
  export PYTHONPYCACHEPREFIX=$PYC
  unset PYTHONDONTWRITEBYTECODE
  CUDA_VISIBLE_DEVICES=$g0 "$PY" bench/train_e2e.py --data "${dirs[0]}" --tokenizer gpt2 --models \
    --nanogpt "$NANOGPT" --time-to-loss "--fast-args=--train.compile --train.time_budget=8" \
    --nanogpt-args="--max_iters=30 --eval_interval=30" --out "$O/warm-up.json" --work "$O/warm-up" \
    > "$O/warm-up.log" 2>&1 || { echo "warm-up failed: see $O/warm-up.log" >&2; exit 1; }
fi
one() {  # corpus dir, GPU
  name=$(basename "$1")
  CUDA_VISIBLE_DEVICES=$2 "$PY" bench/train_e2e.py --data "$1" --tokenizer gpt2 --models --nanogpt "$NANOGPT" \
    --time-to-loss "${variants[@]}" --out "$O/$name.json" --work "$O/$name" > "$O/$name.log" 2>&1
}
# Corpus i runs on GPU (GPU0 + i) mod NG; corpora sharing a GPU run one after another, never side by side.
for ((k = 0; k < NG && k < ${#dirs[@]}; k++)); do
  (for ((i = k; i < ${#dirs[@]}; i += NG)); do one "${dirs[i]}" $(((g0 + i) % NG)); done) &
done
wait
