"""The pretraining run kind: its config schema (config.py) and how a recipe with overrides resolves to it
(resolve.py), what a run needs before its first step (setup.py), and the run itself (run.py). Run through
`lmforge.run_kinds.run("pretrain", cfg)`."""
