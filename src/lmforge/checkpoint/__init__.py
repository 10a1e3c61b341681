"""Checkpoints, in one package: their layout on disk (layout.py), writing them crash-safe (write.py, the training
state in train_state.py, the RNG state in rng.py), checking them whole (verify.py), reading them back (read.py),
rotating a run's (rotate.py), which one a run resumes from (resume.py), sharded ones (sharded.py) and the run-dir
lock every save checks before it publishes (rundir.py).

It stands on the ground floor, beside config/, files.py and errors.py, and imports nothing else of lmforge. Every
floor reads or writes checkpoints: config's resume rules fall back to a checkpoint's own config, models/ reads a
pretrained model and `save_pretrained` writes one, tokenizers/ finds a run's tokenizer, train/ saves and resumes a
run. A package higher up would have had to be split again into a reading half below models/ and a writing half
above train/. What it needed from above came down as data instead: a wrapped model's keys lose their wrapper
prefixes (tensors.py's `normalize_keys`, no unwrapping of the model), full tensors are cut into a sharded model's
shards by `tensors.shard_like` (torch only), and the sharded saves take the ranks as any object with `enabled`,
`is_main`, `rank` and `world_size` (train/distributed.py's `DistInfo` is one). Taking the run-dir lock across
ranks is train/session.py's.

Callers import each name from the module that defines it; this __init__ re-exports nothing."""
