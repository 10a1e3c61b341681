"""Checkpoints: tied weights, wrapper prefixes, manifest verification, pruning, crash safety, safe loading."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open
from torch import nn

from lmforge.checkpoint import train_state as train_state_module
from lmforge.checkpoint import write as checkpoint_write
from lmforge.checkpoint.layout import TRAIN_STATE_FILE, WEIGHTS_FILE, list_checkpoints
from lmforge.checkpoint.read import load_weights, read_config, read_weights
from lmforge.checkpoint.rng import capture_rng_state, restore_rng_state
from lmforge.checkpoint.train_state import load_train_state
from lmforge.checkpoint.verify import latest_checkpoint, verify_checkpoint
from lmforge.checkpoint.write import save_checkpoint, save_run_config
from lmforge.errors import LMForgeError
from lmforge.files import hash_file
from lmforge.models.wrappers import unwrap_model

CONFIG = {"model": {"d_model": 16, "n_layers": 1}, "train": {"lr": 3e-4}}


class TinyLM(nn.Module):
    """Embedding, one hidden layer, an output head tied to the embedding, and a buffer."""

    def __init__(self, vocab: int = 11, d: int = 8, tie: bool = True) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.hidden = nn.Linear(d, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.tok_emb.weight
        self.register_buffer("scale", torch.arange(d, dtype=torch.float32))


class DirTokenizer:
    """Stands in for the project tokenizer: ``save(directory)`` writes its files there."""

    def save(self, directory: Path) -> None:
        (Path(directory) / "tokenizer.json").write_text('{"vocab": ["a", "b"]}')


def _save(run: Path, step: int, model: nn.Module | None = None, **kw) -> Path:
    model = model if model is not None else TinyLM()
    return save_checkpoint(run, step, model, config=CONFIG, **kw)


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = unwrap_model(a).state_dict(), unwrap_model(b).state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- weights


def test_tied_weights_stored_once_and_tie_survives_load(tmp_path):
    torch.manual_seed(0)
    src = TinyLM()
    ckpt = _save(tmp_path, 7, src, tokenizer=DirTokenizer())
    assert ckpt == tmp_path / "checkpoints" / "step_7"
    assert {p.name for p in ckpt.iterdir()} == {
        "model.safetensors",
        "config.yaml",
        "tokenizer.json",
        "manifest.json",
    }
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {"tok_emb.weight", "hidden.weight", "hidden.bias", "scale"}
    torch.manual_seed(1)
    dst = TinyLM()
    assert not torch.equal(dst.tok_emb.weight, src.tok_emb.weight)
    assert load_weights(ckpt, dst) == ([], [])
    _assert_same_weights(src, dst)
    assert dst.lm_head.weight is dst.tok_emb.weight
    weights = read_weights(ckpt)
    assert weights["lm_head.weight"] is weights["tok_emb.weight"]
    assert read_config(ckpt) == CONFIG


def test_untied_checkpoint_into_tied_model_is_refused(tmp_path):
    ckpt = _save(tmp_path, 1, TinyLM(tie=False))
    with pytest.raises(LMForgeError, match="'tok_emb.weight' and 'lm_head.weight' are tied in the model"):
        load_weights(ckpt, TinyLM(tie=True))


def test_compiled_model_checkpoint_loads_into_eager_and_back(tmp_path):
    torch.manual_seed(0)
    compiled = torch.compile(TinyLM())  # never called: only the wrapper's key prefix matters
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    ckpt = _save(tmp_path, 1, compiled)
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert not any("_orig_mod" in k for k in f.keys())
    eager = TinyLM()
    load_weights(ckpt, eager)
    _assert_same_weights(compiled, eager)
    assert eager.lm_head.weight is eager.tok_emb.weight

    torch.manual_seed(2)
    eager2 = TinyLM()
    ckpt2 = _save(tmp_path, 2, eager2)
    target = torch.compile(TinyLM())
    load_weights(ckpt2, target)
    _assert_same_weights(eager2, target)


def test_ddp_style_module_prefix_is_stripped(tmp_path):
    class Wrapper(nn.Module):  # same key layout as DistributedDataParallel: "module.<name>"
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    torch.manual_seed(0)
    wrapped = Wrapper(TinyLM())
    ckpt = _save(tmp_path, 1, wrapped)
    assert "tok_emb.weight" in read_weights(ckpt)
    eager = TinyLM()
    load_weights(ckpt, eager)
    _assert_same_weights(wrapped.module, eager)
    back = Wrapper(TinyLM())
    load_weights(ckpt, back)
    _assert_same_weights(eager, back.module)


def test_real_ddp_wrapper_round_trip(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(TinyLM(tie=False))
        assert next(iter(ddp.state_dict())).startswith("module.")
        ckpt = _save(tmp_path, 1, ddp)
        eager = TinyLM(tie=False)
        load_weights(ckpt, eager)
        _assert_same_weights(ddp, eager)
        torch.manual_seed(1)
        ddp2 = nn.parallel.DistributedDataParallel(TinyLM(tie=False))
        load_weights(ckpt, ddp2)
        _assert_same_weights(eager, ddp2)
    finally:
        dist.destroy_process_group()


def test_shape_mismatch_names_the_key(tmp_path):
    ckpt = _save(tmp_path, 1, TinyLM(vocab=11))
    with pytest.raises(LMForgeError) as e:
        load_weights(ckpt, TinyLM(vocab=13))
    assert str(e.value) == (
        "checkpoint does not match the model: key 'tok_emb.weight' has shape (11, 8), the model expects (13, 8)"
    )


def test_missing_and_unexpected_keys(tmp_path):
    ckpt = _save(tmp_path, 1)

    class Bigger(TinyLM):
        def __init__(self) -> None:
            super().__init__()
            self.extra = nn.Linear(2, 2)

    class Smaller(TinyLM):
        def __init__(self) -> None:
            super().__init__()
            del self.hidden

    with pytest.raises(LMForgeError, match=r"^checkpoint does not match the model: key 'extra.weight' is missing"):
        load_weights(ckpt, Bigger())
    with pytest.raises(LMForgeError, match=r"unexpected key 'hidden\.(weight|bias)' \(not in the model\)$"):
        load_weights(ckpt, Smaller())
    missing, unexpected = load_weights(ckpt, Bigger(), strict=False)
    assert (missing, unexpected) == (["extra.weight", "extra.bias"], [])
    missing, unexpected = load_weights(ckpt, Smaller(), strict=False)
    assert missing == [] and sorted(unexpected) == ["hidden.bias", "hidden.weight"]


def test_partially_overlapping_views_are_saved_as_copies(tmp_path):
    class Views(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            base = torch.arange(12.0)
            self.register_buffer("whole", base)
            self.register_buffer("tail", base[6:])  # shares memory with `whole` but is a different view

    ckpt = _save(tmp_path, 1, Views())
    weights = read_weights(ckpt)
    assert torch.equal(weights["tail"], torch.arange(6.0, 12.0))
    assert torch.equal(weights["whole"], torch.arange(12.0))


# ------------------------------------------------------------------------------------ layout, manifest


def test_manifest_lists_every_file_with_size_and_hash(tmp_path):
    # train_state.pt is hashed as it is written (and written without torch.save's per-record CRC-32)
    ckpt = _save(tmp_path, 3, tokenizer=DirTokenizer(), train_state={"step": 3, "m": torch.arange(5000.0)})
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert set(files) == {"model.safetensors", "config.yaml", "tokenizer.json", "train_state.pt"}
    for rel, entry in files.items():
        assert entry["size"] == (ckpt / rel).stat().st_size
        assert entry["sha256"] == hash_file(ckpt / rel)[1]
    assert verify_checkpoint(ckpt) is None
    assert torch.equal(load_train_state(ckpt)["m"], torch.arange(5000.0))


def test_verify_catches_truncation_missing_file_bad_hash_and_no_manifest(tmp_path):
    ckpt = _save(tmp_path, 1, train_state={"step": 1})
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    assert verify_checkpoint(ckpt) == f"model.safetensors has {len(data) - 10} bytes, the manifest says {len(data)}"
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert verify_checkpoint(ckpt) == "model.safetensors does not match its sha256 in the manifest"
    weights.write_bytes(data)
    assert verify_checkpoint(ckpt) is None
    (ckpt / "train_state.pt").unlink()
    assert verify_checkpoint(ckpt) == "missing file train_state.pt"
    (ckpt / "manifest.json").unlink()
    assert verify_checkpoint(ckpt) == "no manifest.json (the save did not finish)"


def test_latest_skips_corrupt_newer_checkpoint_with_warning(tmp_path, capsys):
    for step in (1, 2, 3):
        _save(tmp_path, step, keep_last=None)
    assert latest_checkpoint(tmp_path).name == "step_3"
    w = tmp_path / "checkpoints" / "step_3" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:20])
    (tmp_path / "checkpoints" / "step_2" / "config.yaml").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_1"
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and "step_3: model.safetensors has 20 bytes" in err
    assert "step_2: missing file config.yaml" in err
    assert latest_checkpoint(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step_1"
    with pytest.raises(LMForgeError, match=r"checkpoint .*step_3 is not usable: model.safetensors has 20 bytes"):
        latest_checkpoint(tmp_path / "checkpoints" / "step_3")
    assert latest_checkpoint(tmp_path / "checkpoints" / "step_1").name == "step_1"


def test_latest_with_nothing_usable(tmp_path):
    with pytest.raises(LMForgeError, match="the path does not exist"):
        latest_checkpoint(tmp_path / "nope")
    with pytest.raises(LMForgeError, match="no checkpoints in"):
        latest_checkpoint(tmp_path)
    ckpt = _save(tmp_path, 1)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(LMForgeError, match="no usable checkpoint in .*: all 1 failed verification"):
        latest_checkpoint(tmp_path)


def test_keep_last_prunes_oldest(tmp_path):
    for step in (10, 20, 30, 40, 50):
        _save(tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_40", "step_50"]
    _save(tmp_path, 60, keep_last=None)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_40", "step_50", "step_60"]
    # Resumed from step 40: a re-save at 45 keeps it and leaves the later (abandoned) step_60 alone.
    _save(tmp_path, 45, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_45", "step_50", "step_60"]


def test_list_checkpoints_sorts_numerically_and_ignores_scratch(tmp_path):
    for step in (100, 9, 20):
        _save(tmp_path, step, keep_last=None)
    (tmp_path / "checkpoints" / f".tmp-step_200-{os.getpid()}").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_9", "step_20", "step_100"]
    assert list_checkpoints(tmp_path / "empty") == []


def test_resaving_a_step_replaces_it(tmp_path):
    torch.manual_seed(0)
    _save(tmp_path, 5, TinyLM())
    torch.manual_seed(1)
    newer = TinyLM()
    ckpt = _save(tmp_path, 5, newer)
    loaded = TinyLM()
    load_weights(ckpt, loaded)
    _assert_same_weights(newer, loaded)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_5"]


# ---------------------------------------------------------------------------------------------- crash safety


DISK_FULL = " (the disk is full: free space there or write elsewhere)"


class _FullFile:
    """A file on a disk that fills up after 64 bytes."""

    def __init__(self, path, mode) -> None:
        self.f, self.written = open(path, mode), 0

    def write(self, data) -> int:
        if self.written > 64:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.written += memoryview(data).nbytes
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _open_on_a_full_disk(path, mode="r", **kwargs):
    return _FullFile(path, mode) if Path(path).name == TRAIN_STATE_FILE else open(path, mode, **kwargs)


@pytest.mark.parametrize("target", ["save_file", "torch_save", "fsync", "torch_zip_writer", "rust_library"])
def test_disk_full_keeps_earlier_checkpoints(tmp_path, monkeypatch, target):
    first = _save(tmp_path, 1, train_state={"step": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def half_written_weights(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # a partial file before the disk filled up
        full()

    if target == "save_file":
        monkeypatch.setattr(checkpoint_write, "save_file", half_written_weights)
    elif target == "torch_save":
        monkeypatch.setattr(torch, "save", full)
    elif target == "fsync":
        monkeypatch.setattr(os, "fsync", full)
    elif target == "torch_zip_writer":  # the real torch.save on a file that fills up: its RuntimeError
        monkeypatch.setattr(train_state_module, "open", _open_on_a_full_disk, raising=False)
    else:  # tokenizers and safetensors (Rust) put the errno in their message
        rust_error = Exception("write (os error 28)")
        monkeypatch.setattr(checkpoint_write, "_write_yaml", lambda *a: (_ for _ in ()).throw(rust_error))
    with pytest.raises(LMForgeError) as e:
        _save(tmp_path, 2, train_state={"step": 2, "big": torch.zeros(1000)})
    assert str(e.value) == "could not save checkpoint step_2: No space left on device" + DISK_FULL
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]
    assert verify_checkpoint(first) is None
    assert latest_checkpoint(tmp_path) == first


def test_bad_train_state_is_rejected_before_writing(tmp_path):
    with pytest.raises(TypeError, match=r"train_state\['sched'\]\['fn'\] has type function"):
        _save(tmp_path, 1, train_state={"sched": {"fn": lambda s: s}})
    assert list_checkpoints(tmp_path) == []


def test_stale_scratch_dir_of_dead_process_is_removed(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    stale = tmp_path / "checkpoints" / f".tmp-step_4-{dead_pid}"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"partial")
    _save(tmp_path, 5)
    assert not stale.exists()


def test_save_run_config(tmp_path):
    path = save_run_config(tmp_path / "run", CONFIG)
    assert path == tmp_path / "run" / "config.yaml"
    assert yaml.safe_load(path.read_text()) == CONFIG
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]


# ---------------------------------------------------------------------------------------------- train state


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_train_state_is_refused(tmp_path):
    ckpt = _save(tmp_path, 1)
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "payload": Evil(marker)}, ckpt / "train_state.pt")
    with pytest.raises(LMForgeError, match=r"^refusing to load .*train_state.pt: it holds objects other than"):
        load_train_state(ckpt)
    assert not marker.exists()


def test_train_state_missing_or_corrupt(tmp_path):
    ckpt = _save(tmp_path, 1)
    with pytest.raises(LMForgeError, match="no train_state.pt in"):
        load_train_state(ckpt)
    (ckpt / "train_state.pt").write_bytes(b"not a zip")
    with pytest.raises(LMForgeError, match="could not read .*train_state.pt"):
        load_train_state(ckpt)


def test_optimizer_and_rng_state_round_trip(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model.lm_head(model.hidden(model.tok_emb(torch.tensor([1, 2, 3])))).pow(2).mean().backward()
    opt.step()
    sched.step()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = {
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "rng": capture_rng_state(),
        "data": {"epoch": 0, "position": 12, "shards": ["a.bin", "b.bin"]},
        "step": 1,
    }
    expected = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(4))
    ckpt = _save(tmp_path, 1, model, train_state=state)
    loaded = torch.load(ckpt / "train_state.pt", weights_only=True)  # the documented contract
    loaded = load_train_state(ckpt)
    assert loaded["step"] == 1 and loaded["data"] == state["data"]

    model2 = TinyLM()
    load_weights(ckpt, model2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    opt2.load_state_dict(loaded["optimizer"])
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    sched2.load_state_dict(loaded["scheduler"])
    assert sched2.get_last_lr() == sched.get_last_lr()
    for p, p2 in zip(model.parameters(), model2.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(opt.state[p][key], opt2.state[p2][key], rtol=0, atol=0)

    random.random(), np.random.rand(5), torch.rand(9)  # move every generator on
    restore_rng_state(loaded["rng"])
    got = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(4))
    assert got[:3] == expected[:3]
    assert torch.equal(got[3], expected[3])


def test_malformed_rng_state(tmp_path):
    with pytest.raises(LMForgeError, match="malformed RNG state"):
        restore_rng_state({"python": {"version": 3}})


def test_identical_weights_give_identical_weight_files(tmp_path):
    # safetensors writes its metadata in hash-map order, new for every call: without sorting, two saves of one
    # model differ in half the cases (two metadata keys), so 12 saves nearly always disagree somewhere.
    torch.manual_seed(0)
    model = TinyLM()
    digests = {hash_file(_save(tmp_path / f"r{i}", 1, model) / WEIGHTS_FILE)[1] for i in range(12)}
    assert len(digests) == 1
    # The order in the file's header, not the reader's (it returns a hash map).
    with open(tmp_path / "r0" / "checkpoints" / "step_1" / WEIGHTS_FILE, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    assert list(meta) == sorted(meta)
    loaded = TinyLM()
    load_weights(tmp_path / "r0" / "checkpoints" / "step_1", loaded)
    _assert_same_weights(model, loaded)
