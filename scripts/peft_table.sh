#!/usr/bin/env bash
# Full fine-tuning vs each PEFT method on the bundled sentiment set, from the README demo's pretrained model
# (runs/demo): dev accuracy and trainable parameters, one row per method, written as markdown to $OUT/peft.md.
# CPU: about 1.5 minutes per method on 2 cores with EPOCHS=1.
set -euo pipefail
INIT=${INIT:-runs/demo} OUT=${OUT:-runs/peft} EPOCHS=${EPOCHS:-1}
METHODS=${METHODS:-"full lora houlsby pfeiffer prefix prompt topk adamix"}
mkdir -p "$OUT"
echo "| method | trainable params | share of model | dev accuracy |" > "$OUT/peft.md"
echo "|---|---:|---:|---:|" >> "$OUT/peft.md"
for m in $METHODS; do
  args=(--run.dir="$OUT/$m" --train.epochs="$EPOCHS")
  # Full fine-tuning keeps the recipe's lr; the adapters train few parameters and take a larger one.
  [ "$m" != full ] && args+=(--peft.method="$m" --train.lr=2e-3)
  lmforge finetune demo-sentiment --init "$INIT" "${args[@]}" > "$OUT/$m.log" 2>&1 || { echo "$m failed"; continue; }
  python3 - "$m" "$OUT/$m" >> "$OUT/peft.md" <<'PY'
import json, sys, pathlib
m, run = sys.argv[1], pathlib.Path(sys.argv[2])
acc = json.loads((run / "eval.json").read_text())["accuracy"]
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
info = next((r for r in rows if "trainable_params" in r), None)
t, n = (info["trainable_params"], info["total_params"]) if info else (None, None)
share = f"{100 * t / n:.2f}%" if info else "100%"
print(f"| {m} | {t if t is not None else 'all'} | {share} | {100 * acc:.1f} |")
PY
  tail -1 "$OUT/peft.md"
done
