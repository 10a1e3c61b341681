"""Experiments over many runs: a subprocess runner with skip/resume (runner.py), table and JSON writers
(tables.py), scaling-law fits (scaling.py), their plots (plots.py) and `lmforge scaling` sweeps (sweep.py)."""
