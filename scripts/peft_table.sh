#!/usr/bin/env bash
# Full fine-tuning vs each PEFT method on the sentiment set, from one pretrained model: trainable parameters,
# dev and test accuracy, one markdown row per method in $OUT/peft.md (and every run's numbers in $OUT/runs.jsonl).
#
# Each method runs at each of its learning rates; its row keeps the run with the best dev accuracy, and reports
# that run's test accuracy (learning rates are chosen on dev only). Runs go $JOBS at a time: a GPU takes several
# fine-tunings of a small model at once.
#
#   INIT=runs/study/gpt bash scripts/peft_table.sh                   # docs/peft.md (GPU)
#   INIT=runs/demo RECIPE=demo-sentiment JOBS=1 METHODS="full lora" bash scripts/peft_table.sh   # CPU
#
# INIT     the pretrained run (required)        RECIPE  fine-tune recipe (default sst2-gpt)
# EXTRA    more `lmforge finetune` arguments    METHODS the rows to run (default: all of GRID)
# OUT      output dir (default runs/peft)       JOBS    runs at a time (default 4)
set -euo pipefail
: "${INIT:?set INIT to a pretrained run dir}"
RECIPE=${RECIPE:-sst2-gpt} OUT=${OUT:-runs/peft} JOBS=${JOBS:-4} EXTRA=${EXTRA:-}
# row | learning rates | method options. Bottleneck sizes put Houlsby, Pfeiffer and AdaMix near 1% of a
# 30M-parameter GPT; prefix-tuning runs with Li & Liang's reparameterisation MLP and without it.
GRID=${GRID:-"
full          | 1e-4,3e-4 |
lora          | 5e-4,2e-3 | --peft.method=lora
houlsby       | 5e-4,2e-3 | --peft.method=houlsby --peft.bottleneck=16
pfeiffer      | 5e-4,2e-3 | --peft.method=pfeiffer --peft.bottleneck=32
prefix-mlp    | 5e-4,2e-3 | --peft.method=prefix
prefix        | 2e-3,1e-2 | --peft.method=prefix --peft.reparam_hidden=0
prompt        | 1e-2,5e-2 | --peft.method=prompt
topk          | 1e-4,3e-4 | --peft.method=topk --peft.k=2
adamix        | 5e-4,2e-3 | --peft.method=adamix --peft.bottleneck=16
"}
METHODS=${METHODS:-$(awk -F'|' 'NF > 1 {gsub(/ /, "", $1); printf "%s ", $1}' <<< "$GRID")}
mkdir -p "$OUT"

jobs_list() {  # one line per run: name lr options...
  while IFS='|' read -r name lrs opts; do
    name=$(echo "$name" | xargs)
    [ -z "$name" ] && continue
    [[ " $METHODS " == *" $name "* ]] || continue
    for lr in ${lrs//,/ }; do echo "$name $lr $opts" | sed 's/ *$//'; done  # xargs -L joins lines ending in a blank
  done <<< "$GRID"
}

run_one() {  # name lr options...
  local name=$1 lr=$2; shift 2
  local dir="$OUT/$name-lr$lr"
  rm -rf "$dir"
  # shellcheck disable=SC2086  # EXTRA and the options are word lists
  if python -m lmforge.cli finetune "$RECIPE" --init "$INIT" --run.dir="$dir" --train.lr="$lr" $EXTRA "$@" \
    > "$dir.log" 2>&1; then
    echo "$name lr $lr: $(grep -m1 '^dev' "$dir.log" || true)"
  else
    echo "$name lr $lr failed: $(tail -1 "$dir.log")"
  fi
}
export -f run_one
export OUT RECIPE INIT EXTRA
jobs_list | xargs -P "$JOBS" -L 1 bash -c 'run_one "$@"' _

python3 - "$OUT" $METHODS > "$OUT/peft.md" <<'PY'
import json, pathlib, sys

out, methods = pathlib.Path(sys.argv[1]), sys.argv[2:]
runs = []
for d in sorted(out.glob("*-lr*")):
    if not (d / "eval.json").is_file():
        continue
    name, lr = d.name.rsplit("-lr", 1)
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    info = next((r for r in rows if "trainable_params" in r), None)
    test = d / "eval_test.json"
    runs.append({
        "method": name, "lr": float(lr), "dev": json.loads((d / "eval.json").read_text())["accuracy"],
        "test": json.loads(test.read_text())["accuracy"] if test.is_file() else None,
        "trainable": info["trainable_params"] if info else None, "total": info["total_params"] if info else None,
    })
(out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
print("| method | trainable params | share | lr (best dev) | dev acc | test acc |")
print("|---|---:|---:|---:|---:|---:|")
for m in methods:
    mine = [r for r in runs if r["method"] == m]
    if not mine:
        print(f"| {m} | failed | | | | |")
        continue
    best = max(mine, key=lambda r: r["dev"])
    if best["trainable"] is None:  # full fine-tuning trains every parameter
        count, share = "all", "100%"
    else:
        count, share = f"{best['trainable']:,}", f"{100 * best['trainable'] / best['total']:.2f}%"
    test = f"{100 * best['test']:.1f}" if best["test"] is not None else "—"
    print(f"| {m} | {count} | {share} | {best['lr']:g} | {100 * best['dev']:.1f} | {test} |")
PY
cat "$OUT/peft.md"
