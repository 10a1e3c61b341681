"""The fine-tuning run kind: how a recipe, its `--init` and overrides resolve to a config (resolve.py), the run
(run.py), and the export of a fine-tuned run as a Hugging Face task model (export.py). Its config schema is the
tasks' (lmforge.tasks.config), which the task types read too. Run through `lmforge.run_kinds.run("finetune", cfg)`."""
