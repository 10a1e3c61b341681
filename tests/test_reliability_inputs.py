"""One clear line for every bad input: each case runs the CLI entry point (`lmforge.cli.main`, in this process unless
the case needs a fresh one) and asserts the exact line on stderr, a non-zero exit code, no traceback, and that the
checkpoints of an existing run are intact. Also: a full disk, out-of-range values, overlong prompts (non-finite
losses and gradients: test_reliability_streak.py)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmforge.checkpoint import write as checkpoint_write
from lmforge.checkpoint.verify import latest_checkpoint, verify_checkpoint
from lmforge.cli import main
from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.errors import LMForgeError
from lmforge.tokenizers import train_tokenizer

TINY = ["--model.preset=gpt-tiny", "--train.batch_size=4", "--train.seq_len=32", "--train.warmup_steps=2"]
TINY += ["--train.log_every=1", "--train.eval_every=100", "--sample.prompts=[]", "--train.eval_batches=2"]


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


def pretrain(prepared, run: Path, *extra: str) -> list[str]:
    tok, data = prepared
    return ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
            "--model.vocab_size=512", *extra]  # fmt: skip


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error_line(capsys, *args: str) -> str:
    """Run a command that must fail: exit 2, exactly one stderr line (with --quiet: no status lines), no traceback;
    return that line."""
    rc, _, err = cli(capsys, *args, "--quiet")
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def last_error_line(capsys, *args: str) -> str:
    """Like one_error_line, for commands that fail after training started (progress lines come first)."""
    rc, _, err = cli(capsys, *args)
    assert rc == 2, err
    assert "Traceback" not in err
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1
    return err.strip().splitlines()[-1]


def fingerprint(run: Path) -> dict[str, str]:
    """sha256 of every checkpoint file of a run."""
    root = run / "checkpoints"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def train_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def rewrite_manifest(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for rel in manifest["files"]:
        data = (ckpt / rel).read_bytes()
        manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


# --- data and config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "error: corpus path not found: {tmp}/nope.txt"),
        ("empty", "error: {tmp}/empty.txt: empty file (no documents)"),
        ("blank", "error: {tmp}/blank.txt: empty file (no documents)"),
        (
            "empty_dir",
            "error: {tmp}/nothing: directory has no readable files ({readable}), nor is it a save_to_disk dataset",
        ),
        ("binary", "error: {tmp}/blob.txt: binary file (contains NUL bytes; text must be UTF-8)"),
        ("jsonl", "error: {tmp}/bad.jsonl:3: malformed JSON (Expecting ',' delimiter, column 14)"),
        ("jsonl_field", "error: {tmp}/nofield.jsonl:2: no field 'text' (fields: body)"),
        ("csv", "error: {tmp}/bad.csv:3: malformed CSV (',' expected after '\"')"),
        ("csv_eof", "error: {tmp}/open.csv:4: malformed CSV (unexpected end of data)"),
        (
            "one_doc",
            "error: need at least 2 documents to split into train and val, got 1 (a document is a JSONL line, a CSV "
            "or Parquet row, or a text file; one longer than 32k characters splits at paragraphs): add text or files",
        ),  # fmt: skip
        ("unknown_key", "error: unknown config key 'train.lrr' — did you mean 'train.lr'?"),
        ("unknown_section", "error: unknown config key 'trian' — did you mean 'train.lr'?"),
        ("bad_type", "error: train.lr: expected a number, got 'fast'"),
        ("bad_int", "error: train.max_steps: expected an integer, got 2.5"),
        ("bad_choice", "error: train.precision: expected one of 'auto', 'fp32', 'bf16', got 'fp8'"),
        ("unknown_objective", "error: unknown objective 'causal' — did you mean 'causal_lm'?"),
        ("unknown_recipe", "error: unknown recipe 'gtp' — did you mean 'gpt'?"),
        ("vocab", "error: model.vocab_size=300 is smaller than the tokenizer's 512 tokens"),
        (
            "overlong",
            "error: train.seq_len=32 exceeds model gpt-tiny's max_seq_len 16: lower --train.seq_len or raise "
            "--model.max_seq_len",
        ),  # fmt: skip
    ],
)
def test_bad_input_gives_one_line_and_nonzero_exit(case, expected, prepared, tmp_path, capsys):
    from lmforge.data.corpus.readers import READABLE

    tok, data = prepared
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\n\t\n")
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / "blob.txt").write_bytes(bytes(range(256)) * 20)
    (tmp_path / "bad.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n{"text": "a" "b"}\n')
    (tmp_path / "nofield.jsonl").write_text('{"text": "one"}\n{"body": "two"}\n')
    (tmp_path / "bad.csv").write_text('text,label\n"fine",1\n"bro"ken",2\n"never read",3\n')
    (tmp_path / "open.csv").write_text('text\nfine\n"also fine"\n"unterminated,\nand the rest\n')
    (tmp_path / "one.txt").write_text(load_default_corpus()[0])
    inputs = {"missing": "nope.txt", "empty": "empty.txt", "blank": "blank.txt", "empty_dir": "nothing",
              "binary": "blob.txt", "jsonl": "bad.jsonl", "jsonl_field": "nofield.jsonl", "csv": "bad.csv",
              "csv_eof": "open.csv", "one_doc": "one.txt"}  # fmt: skip
    run = f"--run.dir={tmp_path / 'run'}"
    if case in inputs:
        args = ["pretrain", "gpt", run, *TINY, "--data.vocab_size=300", f"--data.inputs=[{tmp_path / inputs[case]}]"]
    elif case == "unknown_recipe":
        args = ["pretrain", "gtp", run]
    else:
        extra = {
            "unknown_key": ["--train.lrr=1e-3"], "unknown_section": ["--trian.lr=1e-3"],
            "bad_type": ["--train.lr=fast"], "bad_int": ["--train.max_steps=2.5"],
            "bad_choice": ["--train.precision=fp8"],
            "unknown_objective": ["--objective.name=causal"], "vocab": ["--model.vocab_size=300"],
            "overlong": ["--model.max_seq_len=16", "--train.max_steps=1"],
        }[case]  # fmt: skip
        args = pretrain(prepared, tmp_path / "run", *extra)
    line = one_error_line(capsys, *args)
    assert line == expected.format(tmp=tmp_path, readable=READABLE)


def test_non_utf8_bytes_are_replaced_and_counted_not_an_error(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(load_default_corpus()[:8]):
        (docs / f"{i}.txt").write_text(text, encoding="utf-8")
    broken = (docs / "3.txt").read_bytes()
    (docs / "3.txt").write_bytes(broken[:500] + b"caf\xe9 \xff\xfe" + broken[500:])  # Latin-1 é + 2 junk bytes
    run = tmp_path / "run"
    rc, _, err = cli(capsys, "pretrain", "gpt", f"--run.dir={run}", *TINY, f"--data.inputs=[{docs}]",
                     "--data.vocab_size=400", "--train.max_steps=1")  # fmt: skip
    assert rc == 0, err
    assert "warning: 3 bytes of the input are not valid UTF-8 and were replaced with U+FFFD" in err.splitlines()
    assert json.loads((run / "data" / "meta.json").read_text())["replaced_bytes"] == 3
    # `lmforge data prepare` reports the same count.
    rc, out, err = cli(capsys, "data", "prepare", str(docs), "--out", str(tmp_path / "prep"), "--tokenizer",
                       str(run / "tokenizer"))  # fmt: skip
    assert rc == 0, err
    assert "  replaced non-UTF-8 bytes: 3" in out.splitlines()


def labelled_set(root: Path, train: list[tuple[str, str]]) -> Path:
    """A labelled-set dir (meta.json + train/dev jsonl) that `--data.source=dir` reads."""
    root.mkdir()
    meta = {"labels": ["neg", "pos"], "task_type": "classification", "splits": ["train", "dev"]}
    (root / "meta.json").write_text(json.dumps(meta))
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in train))
    (root / "dev.jsonl").write_text(json.dumps({"text": "a fine day", "label": "pos"}) + "\n")
    return root


def test_label_outside_the_label_set_names_file_and_line(tmp_path, capsys):
    from lmforge.data.labelled.readers import read_table

    table = tmp_path / "reviews.csv"
    table.write_text("text,label\ngood film,positive\ndull,negative\nmeh,neutral\n")
    with pytest.raises(LMForgeError) as e:
        read_table(table, "text", "label", labels=["negative", "positive"])
    assert str(e.value) == f"{table}:4: label 'neutral' is not one of 'negative', 'positive'"
    d = labelled_set(tmp_path / "set", [("fine", "pos"), ("odd", "maybe")])
    line = one_error_line(capsys, "finetune", "--init", "gpt-tiny", f"--run.dir={tmp_path / 'ft'}",
                          "--data.source=dir", f"--data.dir={d}")  # fmt: skip
    assert line == f"error: {d / 'train.jsonl'}:2: label 'maybe' is not one of 'neg', 'pos'"


def test_overlong_finetuning_input_truncates_with_a_count_or_errors(tmp_path, capsys):
    texts = [("a good and pleasant day " * 6, "pos"), ("bad", "neg"), ("a dull, dreary and tiresome evening " * 4,
             "neg"), ("nice", "pos")]  # fmt: skip
    d = labelled_set(tmp_path / "set", texts)
    args = ["finetune", "--init", "gpt-tiny", "--data.source=dir", f"--data.dir={d}", "--model.vocab_size=280",
            "--task.max_len=16", "--train.max_steps=1", "--train.batch_size=4"]  # fmt: skip
    line = one_error_line(capsys, *args, f"--run.dir={tmp_path / 'strict'}", "--task.overlong=error")
    assert line == (
        f"error: {d / 'train.jsonl'} example 0: its text has 31 tokens, more than the 14 that task.max_len=16 leaves "
        "(raise task.max_len, or set task.overlong=truncate to cut it)"
    )  # GPT-1 framing: start + text + extract
    rc, _, err = cli(capsys, *args, f"--run.dir={tmp_path / 'cut'}")
    assert rc == 0, err
    assert ("warning: 2 of 4 training examples are longer than task.max_len=16 tokens and were truncated "
            "(task.overlong=error refuses them instead)") in err.splitlines()  # fmt: skip


def test_debug_shows_the_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lmforge.cli", "pretrain", "gpt", f"--run.dir={tmp_path}", "--train.lrr=1"]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 2
    assert plain.stderr == "error: unknown config key 'train.lrr' — did you mean 'train.lr'?\n"
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, env=env, timeout=300)
    assert debug.returncode == 1
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert 'lmforge/config/core.py", line' in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == (
        "lmforge.errors.LMForgeError: unknown config key 'train.lrr' — did you mean 'train.lr'?"
    )


# --- runs that exist -----------------------------------------------------------------------------------------------


def test_resume_with_a_changed_config_is_refused_and_checkpoints_stay(prepared, tmp_path, capsys):
    import test_reliability_streak  # noqa: F401 (registers the objective test_poisoned_lm, named below)

    run = tmp_path / "run"
    assert cli(capsys, *pretrain(prepared, run, "--train.max_steps=2"))[0] == 0
    before = fingerprint(run)
    new_run = "start a new run with another --run.dir"
    for change, expected in [
        ("--model.d_model=32", f"error: cannot change model.d_model when resuming (64 → 32): {new_run}"),
        (
            "--model.preset=llama-tiny",
            f"error: cannot change model.preset when resuming ('gpt-tiny' → 'llama-tiny'): {new_run}",
        ),
        ("--data.val_fraction=0.2", f"error: cannot change data.val_fraction when resuming (0.05 → 0.2): {new_run}"),
        (
            "--objective.name=test_poisoned_lm",
            f"error: cannot change objective.name when resuming ('causal_lm' → 'test_poisoned_lm'): {new_run}",
        ),  # fmt: skip
        ("--train.seq_len=16", f"error: cannot change train.seq_len when resuming (32 → 16): {new_run}"),
    ]:
        # Resuming needs nothing but the run dir; what is given must agree with the run.
        args = ["pretrain", f"--run.dir={run}", "--train.max_steps=4", "--resume", change]
        assert one_error_line(capsys, *args) == expected
    assert one_error_line(capsys, *pretrain(prepared, run, "--train.max_steps=4")) == (
        f"error: run dir {run} already has checkpoints: pass --resume to continue it, or choose another --run.dir"
    )
    assert fingerprint(run) == before


def test_checkpoint_of_another_architecture_is_refused_by_resume_and_generate(prepared, tmp_path, capsys):
    gpt, llama = tmp_path / "gpt", tmp_path / "llama"
    assert cli(capsys, *pretrain(prepared, gpt, "--train.max_steps=1"))[0] == 0
    assert cli(capsys, *pretrain(prepared, llama, "--train.max_steps=1", "--model.preset=llama-tiny"))[0] == 0
    ckpt = gpt / "checkpoints" / "step_1"
    shutil.copy(llama / "checkpoints" / "step_1" / "model.safetensors", ckpt / "model.safetensors")
    rewrite_manifest(ckpt)
    before = fingerprint(gpt)
    expected = (
        "error: checkpoint does not match the model: key 'decoder.pos_emb.emb.weight' is missing from the checkpoint"
    )
    assert one_error_line(capsys, *pretrain(prepared, gpt, "--train.max_steps=2", "--resume")) == expected
    assert one_error_line(capsys, "generate", str(gpt), "--prompt", "The") == expected
    assert fingerprint(gpt) == before


def test_disk_full_while_saving_keeps_earlier_checkpoints(prepared, tmp_path, capsys, monkeypatch):
    real, calls = checkpoint_write.save_file, []

    def full_disk(*args, **kw):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint: the disk fills up while its weights are written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kw)

    monkeypatch.setattr(checkpoint_write, "save_file", full_disk)
    run = tmp_path / "run"
    args = pretrain(prepared, run, "--train.save_every=2", "--train.max_steps=6", "--train.deterministic")
    full = "No space left on device (the disk is full: free space there or write elsewhere)"
    assert last_error_line(capsys, *args) == f"error: could not save checkpoint step_4: {full}"
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_2"]  # no scratch dir left behind
    assert verify_checkpoint(run / "checkpoints" / "step_2") is None
    monkeypatch.setattr(checkpoint_write, "save_file", real)  # space freed: the run resumes from step 2
    rc, _, err = cli(capsys, *args, "--resume")
    assert rc == 0, err
    assert [r["step"] for r in train_rows(run) if "loss" in r] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "value, message",
    [
        ("max_steps=0", "train.max_steps must be > 0, got 0"),
        ("save_every=0", "train.save_every must be > 0, got 0"),
        ("eval_every=0", "train.eval_every must be > 0, got 0"),
        ("grad_accum=0", "train.grad_accum must be > 0, got 0"),
        ("lr=-0.001", "train.lr must be >= 0, got -0.001"),
        ("batch_size=-2", "train.batch_size must be > 0, got -2"),
    ],
)
@pytest.mark.parametrize("command", ["pretrain", "finetune", "align"])
def test_out_of_range_values_are_one_line_before_any_work(command, value, message, tmp_path, capsys):
    run = tmp_path / "run"
    args = {
        "pretrain": ["pretrain", "gpt"],
        "finetune": ["finetune", "sst2-gpt", "--init", "gpt-tiny"],
        "align": ["align", "sft", "sft-sentiment", "--init", "gpt-tiny"],
    }[command]
    assert one_error_line(capsys, *args, f"--run.dir={run}", f"--train.{value}") == f"error: {message}"
    assert not run.exists()  # refused before anything was written


def test_a_new_lr_given_on_resume_is_applied_from_the_resumed_step(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    args = pretrain(prepared, run, "--train.max_steps=4", "--train.schedule=constant", "--train.lr=1e-3")
    assert cli(capsys, *args)[0] == 0
    rc, _, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=6", "--train.lr=2.5e-4")
    assert rc == 0, err
    lrs = {r["step"]: r["lr"] for r in train_rows(run) if "lr" in r}
    # The logged lr is the next step's: warmup (2 steps) ends at step 1; from step 5 on, the new peak.
    assert [lrs[s] for s in range(1, 7)] == [1e-3, 1e-3, 1e-3, 1e-3, 2.5e-4, 2.5e-4]
    saved = json.loads(json.dumps(__import__("yaml").safe_load((run / "config.yaml").read_text())))
    assert saved["train"]["lr"] == 2.5e-4 and saved["train"]["max_steps"] == 6


# --- overlong prompts ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_run(prepared, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("small") / "run"
    tok, data = prepared
    assert main(["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
                 "--model.vocab_size=512", "--train.max_steps=2"]) == 0  # fmt: skip
    return run


def test_overlong_generation_prompt_errors_by_default(small_run, capsys):
    from lmforge.tokenizers import Tokenizer

    prompt = "It is a truth universally acknowledged, " * 20
    n = len(Tokenizer.load(latest_checkpoint(small_run)).encode(prompt))
    assert n > 128
    line = one_error_line(capsys, "generate", str(small_run), "--prompt", "Hi", "--prompt", prompt)
    assert line == (
        f"error: prompt has {n} tokens, more than the model's max_seq_len 128 (shorten it, or truncate it: "
        "--overlong truncate)"
    )


def test_overlong_prompt_truncation_keeps_the_end_and_warns(small_run, capsys):
    from lmforge.api import load
    from lmforge.models.generate import generate, generate_text

    model, tok = load(small_run)
    prompt = "It is a truth universally acknowledged, " * 20
    ids = tok.encode(prompt)
    out = generate_text(model, tok, [prompt], max_new_tokens=8, temperature=0.0, overlong="truncate")
    assert capsys.readouterr().err == (
        f"warning: prompt has {len(ids)} tokens, more than max_seq_len 128: kept its last 120\n"
    )
    ref = generate(model, torch.tensor([ids[-120:]]), max_new_tokens=8, temperature=0.0, eos_id=tok.eos_id)
    assert out == [tok.decode(ref[0, 120:].tolist())]
    assert len(ref[0]) == 128  # the continuation fits: all 8 new tokens were generated


def test_overlong_encoder_decoder_source_keeps_the_start(capsys):
    from lmforge.models import Transformer, get_preset
    from lmforge.models.generate import generate, generate_text

    tok = train_tokenizer(load_default_corpus()[:3], "bpe", 400, family="bart")
    capsys.readouterr()  # its status line (printed unless an earlier CLI call in this process was --quiet)
    torch.manual_seed(0)
    model = Transformer(get_preset("bart-tiny", vocab_size=tok.vocab_size)).eval()
    source = "It is a truth universally acknowledged, " * 20
    n = len(tok.encode(source)) + 2  # with <s> and </s>
    with pytest.raises(LMForgeError, match=rf"^prompt has {n} tokens, more than the model's max_seq_len 128 "):
        generate_text(model, tok, [source], max_new_tokens=3, temperature=0.0)
    a = generate_text(model, tok, [source], max_new_tokens=3, temperature=0.0, overlong="truncate")
    assert capsys.readouterr().err == f"warning: prompt has {n} tokens, more than max_seq_len 128: kept its first 126\n"
    src = torch.tensor([[tok.bos_id, *tok.encode(source)[:126], tok.eos_id]])
    b = generate(model, src, max_new_tokens=3, temperature=0.0, eos_id=tok.eos_id)
    assert a == [tok.decode(b[0, 1:].tolist())]
