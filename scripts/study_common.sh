# Shared by scripts/finetune_study.sh and scripts/adapt_study.sh (sourced, not run): the CLI, a queue of background
# jobs, and the JSON line each fine-tuning run leaves in a study's results file.
lm() { python -m lmforge.cli "$@"; }

queue() {  # queue COMMAND ARGS...: run it in the background once fewer than $JOBS jobs are running
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  "$@" &
}

record() {  # record NAME RUN_DIR [FLAGS]: {"run", "flags", "dev", "test"} of a finished fine-tune, on stdout
  python - "$@" <<'PY'
import json, sys, pathlib
name, run, flags = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""
test = run / "eval_test.json"
print(json.dumps({"run": name, "flags": flags, "dev": json.loads((run / "eval.json").read_text()),
                  "test": json.loads(test.read_text()) if test.exists() else None}))
PY
}
