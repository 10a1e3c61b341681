"""train.parallel=fsdp on CPU with gloo: two processes train like one with the doubled batch, every family trains
like DDP, sharded checkpoints resume on 1, 2 and 4 processes, an async save killed with SIGKILL leaves the last
good checkpoint, and a sharded run converts to a Hugging Face model and loads in one process."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from process_testing import free_port

from lmforge.checkpoint.layout import MANIFEST_FILE, WEIGHTS_FILE, list_checkpoints
from lmforge.checkpoint.read import read_config, read_weights
from lmforge.checkpoint.train_state import load_train_state
from lmforge.checkpoint.verify import latest_checkpoint, verify_checkpoint
from lmforge.cli import main
from lmforge.errors import LMForgeError

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
PAUSING_CLI = Path(__file__).with_name("pausing_cli.py")
TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.seq_len=32", "--train.warmup_steps=3"]
TINY += ["--train.log_every=1", "--train.eval_every=100", "--train.max_steps=6", "--train.save_every=2"]
TINY += ["--train.deterministic", "--sample.prompts=[]", "--train.eval_batches=2"]
TOL = 2e-5
"""Losses are logged to 6 significant digits; two processes differ from one only in the order of float sums."""


def torchrun(n: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={free_port()}",
           "-m", "lmforge.cli", *args]  # fmt: skip
    res = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def one_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "lmforge.cli", *args], cwd=cwd, env=ENV, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "skipped" not in r}


def assert_close(a: dict[int, float], b: dict[int, float], steps) -> None:
    assert [s for s in steps if s in a and s in b] == list(steps), (a, b)
    assert max(abs(a[s] - b[s]) for s in steps) < TOL, (a, b)


def keep_only(run: Path, step: int) -> None:
    """Pretend the run died after `step`: drop its later checkpoints."""
    for c in list_checkpoints(run):
        if int(c.name.split("_")[1]) > step:
            shutil.rmtree(c)


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(30)


def args(prepared, run: Path, *extra: str) -> list[str]:
    tok, data = prepared
    return ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY, *extra]


@pytest.fixture(scope="module")
def runs(prepared, tmp_path_factory) -> dict[str, Path]:
    """One process with batch 8 (DDP code path, single-file checkpoints) and two FSDP processes with batch 4."""
    d = tmp_path_factory.mktemp("runs")
    one_process(*args(prepared, d / "one", "--train.batch_size=8"), cwd=d)
    torchrun(2, *args(prepared, d / "fsdp", "--train.batch_size=4", "--train.parallel=fsdp"), cwd=d)
    return {"one": d / "one", "fsdp": d / "fsdp"}


def test_two_fsdp_processes_equal_one_process_with_double_batch(runs):
    assert_close(losses(runs["one"]), losses(runs["fsdp"]), range(1, 7))
    newest = latest_checkpoint(runs["fsdp"])
    assert newest.name == "step_6" and not (newest / WEIGHTS_FILE).exists()
    shards = sorted(p.name for p in (newest / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    manifest = json.loads((newest / MANIFEST_FILE).read_text())["files"]
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "train_state.pt"} <= set(manifest)
    # Consolidated in this process, the sharded weights are the one-process run's weights.
    full, ref = read_weights(newest), read_weights(latest_checkpoint(runs["one"]))
    assert full.keys() == ref.keys()
    assert max(float((full[k] - ref[k]).abs().max()) for k in ref) < 1e-5


def test_sharded_checkpoint_resumes_on_1_then_4_processes_on_2_and_under_ddp(runs, prepared, tmp_path):
    uninterrupted = losses(runs["fsdp"])
    # 2 → 1: the two-process checkpoint of step 2 continues in one process with the same global batch.
    on1 = tmp_path / "on1"
    shutil.copytree(runs["fsdp"], on1)
    keep_only(on1, 2)
    one_process(*args(prepared, on1, "--train.batch_size=8", "--resume"), cwd=tmp_path)
    assert_close(uninterrupted, losses(on1), range(3, 7))
    # A sharded checkpoint also continues under ddp (each process loads the full tensors).
    as_ddp = tmp_path / "as_ddp"
    shutil.copytree(runs["fsdp"], as_ddp)
    keep_only(as_ddp, 2)
    one_process(*args(prepared, as_ddp, "--train.batch_size=8", "--resume", "--train.parallel=ddp"), cwd=tmp_path)
    assert_close(uninterrupted, losses(as_ddp), range(3, 7))
    assert (latest_checkpoint(as_ddp) / WEIGHTS_FILE).is_file()
    # 1 → 4: the step-4 checkpoint that one process wrote continues in four.
    on4 = tmp_path / "on4"
    shutil.copytree(on1, on4)
    keep_only(on4, 4)
    assert (latest_checkpoint(on4) / "dcp" / "__0_0.distcp").is_file()
    torchrun(4, *args(prepared, on4, "--train.batch_size=2", "--resume"), cwd=tmp_path)
    assert_close(uninterrupted, losses(on4), range(5, 7))
    # 2 → 2, now recomputing each block's activations in backward: the same losses.
    on2 = tmp_path / "on2"
    shutil.copytree(runs["fsdp"], on2)
    keep_only(on2, 2)
    torchrun(2, *args(prepared, on2, "--train.batch_size=4", "--resume", "--train.activation_checkpointing"),
             cwd=tmp_path)  # fmt: skip
    assert_close(uninterrupted, losses(on2), range(3, 7))


class Workers:
    """Processes of one torchrun-style launch started directly (so the test can SIGKILL each of them), rank 0's
    stderr read line by line."""

    def __init__(self, n: int, argv: list[str], cwd: Path) -> None:
        env = {**ENV, "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        self.procs = [
            subprocess.Popen([sys.executable, *argv], cwd=cwd, text=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                             env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n)})
            for r in range(n)
        ]  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.procs[0].stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.procs[0].poll() is None, "the run ended first:\n" + "\n".join(self.lines[-20:])
            assert time.monotonic() < deadline, "not reached:\n" + "\n".join(self.lines[-20:])
            time.sleep(0.01)

    def kill(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
        for p in self.procs:
            assert p.wait(timeout=60) == -signal.SIGKILL


def test_sigkill_during_async_save_keeps_the_last_good_checkpoint(runs, prepared, tmp_path):
    run = tmp_path / "run"
    argv = [str(PAUSING_CLI), "checkpoint@4:120",
            *args(prepared, run, "--train.batch_size=4", "--train.parallel=fsdp", "--train.async_save")]  # fmt: skip
    workers = Workers(2, argv, tmp_path)
    # The step-4 save pauses in its writer thread once every shard is on disk, before the manifest; training goes on.
    workers.wait_for("pausing 120 s at checkpoint (step 4)")
    scratch = [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-step_4")]
    assert len(scratch) == 1 and (scratch[0] / "dcp" / ".metadata").is_file()
    assert not (scratch[0] / MANIFEST_FILE).exists()
    workers.kill()
    assert [c.name for c in list_checkpoints(run)] == ["step_2"]
    assert latest_checkpoint(run).name == "step_2" and verify_checkpoint(run / "checkpoints" / "step_2") is None
    from lmforge.api import load

    model, _ = load(run)  # one process consolidates the shards
    assert model.num_params() > 0
    torchrun(2, *args(prepared, run, "--train.batch_size=4", "--resume"), cwd=tmp_path)
    assert_close(losses(runs["fsdp"]), losses(run), range(3, 7))  # the staged copy of step 2 was exact
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())


def test_convert_of_a_sharded_run_loads_in_transformers_with_equal_logits(runs, tmp_path):
    import transformers

    from lmforge.api import load

    out = tmp_path / "hf"
    one_process("convert", str(runs["fsdp"]), "--to", "hf", "--out", str(out), cwd=tmp_path)
    ours, _ = load(runs["fsdp"])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    assert float((a - b).abs().max()) <= 1e-4
    ref, _ = load(runs["one"])  # and they are the trained weights
    with torch.no_grad():
        assert float((ref(ids).logits - a).abs().max()) < 1e-4


def test_newest_sharded_checkpoint_failing_verification_falls_back(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["fsdp"], run)
    shard = run / "checkpoints" / "step_6" / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert latest_checkpoint(run).name == "step_4"
    assert "dcp/__1_0.distcp does not match its sha256" in capsys.readouterr().err


def test_crafted_shard_metadata_is_refused_without_running_it(runs, tmp_path):
    c = tmp_path / "ckpt"
    shutil.copytree(latest_checkpoint(runs["fsdp"]), c)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (c / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(LMForgeError, match=r"global (posix|os)\.system is not allowed in checkpoint metadata"):
        read_weights(c)
    assert not marker.exists()


def test_ranks_a_resumed_checkpoint_did_not_have_draw_their_own_masks(prepared, tmp_path):
    """One process saves at step 2; two continue from it with the same global batch. The new rank may not take a
    copy of the saved rank's batch-source generator (it would draw the same masks as rank 0 at every step)."""
    _, data = prepared
    common = ["bert", "--model.preset=bert-tiny", "--model.vocab_size=512", "--train.seq_len=32",
              "--train.log_every=1", "--train.eval_every=100", "--train.save_every=2", "--sample.prompts=[]",
              "--train.eval_batches=2"]  # fmt: skip
    run = tmp_path / "run"
    one_process("pretrain", f"--run.dir={run}", f"--data.inputs=[{data.parent / 'docs.jsonl'}]",
                "--data.vocab_size=512", "--train.batch_size=4", "--train.max_steps=2", *common,
                cwd=tmp_path)  # fmt: skip
    torchrun(2, "pretrain", f"--run.dir={run}", "--train.batch_size=2", "--train.max_steps=4", "--resume", *common,
             cwd=tmp_path)  # fmt: skip
    newest = latest_checkpoint(run)
    assert newest.name.endswith("4")
    loaders = load_train_state(newest)["loader"]
    assert len(loaders) == 2
    assert not torch.equal(loaders[0]["generator"], loaders[1]["generator"])


@pytest.mark.parametrize(
    "recipe,preset", [("bert", "bert-tiny"), ("t5", "t5-tiny"), ("albert", "albert-tiny")],
)  # fmt: skip
def test_every_family_trains_under_fsdp_as_under_ddp(recipe, preset, prepared, tmp_path):
    """Random masks and dropout: both runs draw the same per-rank random numbers, so their losses agree.
    (ALBERT's shared block is sharded with the root; T5's decoder blocks take the encoder output.)"""
    _, data = prepared
    common = [recipe, f"--model.preset={preset}", "--model.vocab_size=512", "--train.batch_size=4",
              "--train.seq_len=32", "--train.max_steps=3", "--train.log_every=1", "--train.eval_every=3",
              "--train.save_every=3", "--sample.prompts=[]", "--train.eval_batches=2"]  # fmt: skip
    ddp = tmp_path / "ddp"
    torchrun(2, "pretrain", f"--run.dir={ddp}", f"--data.inputs=[{data.parent / 'docs.jsonl'}]",
             "--data.vocab_size=512", *common, cwd=tmp_path)  # fmt: skip
    fsdp = tmp_path / "fsdp"  # the same tokenizer and shards (tokenizer training is not bitwise reproducible)
    torchrun(2, "pretrain", f"--run.dir={fsdp}", f"--data.tokenizer={ddp / 'tokenizer'}",
             f"--data.prepared={ddp / 'data'}", "--train.parallel=fsdp", *common, cwd=tmp_path)  # fmt: skip
    assert_close(losses(ddp), losses(fsdp), range(1, 4))


def test_fsdp_only_settings_are_refused_under_ddp(prepared, tmp_path, capsys):
    for key in ("cpu_offload", "async_save"):
        rc = main(args(prepared, tmp_path / key, "--train.batch_size=4", f"--train.{key}=true"))
        assert rc != 0
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"error: train.{key} needs train.parallel=fsdp (it is ddp)"
    over = ["--train.parallel=fsdp", "--train.compile", "--train.compile_mode=reduce-overhead"]
    assert main(args(prepared, tmp_path / "graphs", "--train.batch_size=4", *over)) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "error: train.compile_mode=reduce-overhead (CUDA graphs) does not work with train.parallel=fsdp"


def test_a_ddp_checkpoint_does_not_resume_under_fsdp(runs, prepared, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["one"], run)
    keep_only(run, 2)
    cmd = [sys.executable, "-m", "lmforge.cli", *args(prepared, run, "--train.batch_size=8", "--resume",
                                                      "--train.parallel=fsdp")]  # fmt: skip
    res = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    where = run / "checkpoints" / "step_2"
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint {where} was saved by a train.parallel=ddp run: resume it with ddp"
    )


def test_lora_finetuning_of_a_sharded_run_under_fsdp_equals_one_process(runs, tmp_path):
    """Fine-tuning starts from the sharded pretrained run (consolidated on load); under fsdp every rank evaluates,
    RUN/best gathers the adapter and the task-token rows of the sharded embedding, and the best model is reloaded
    into the shards."""
    import tasks_testing as T

    from lmforge.tasks.base import Dataset

    full = T.sentiment(160, seed=1)
    splits = {"train": Dataset(full.examples[:128], full.labels), "dev": Dataset(full.examples[128:], full.labels)}
    labelled = T.write_labelled_dir(tmp_path / "sentiment", splits)
    common = ["finetune", "sst2-gpt", "--init", str(runs["fsdp"]), "--data.source=dir", f"--data.dir={labelled}",
              "--train.max_steps=4", "--train.log_every=1", "--train.eval_every=2", "--train.lr=2e-3",
              "--task.max_len=48", "--data.max_eval=32", "--model.dropout=0", "--task.head_dropout=0",
              "--task.lm_coef=0", "--peft.method=lora"]  # fmt: skip
    one_process(*common, f"--run.dir={tmp_path / 'one'}", "--train.batch_size=8", cwd=tmp_path)
    two = tmp_path / "two"
    res = torchrun(2, *common, f"--run.dir={two}", "--train.batch_size=4", "--train.parallel=fsdp", cwd=tmp_path)
    assert res.stdout.count("dev (best checkpoint)") == 1  # rank 0 reports
    assert_close(losses(tmp_path / "one"), losses(two), range(1, 5))
    assert json.loads((two / "eval.json").read_text()) == json.loads((tmp_path / "one" / "eval.json").read_text())
    assert (two / "best" / WEIGHTS_FILE).is_file() and read_config(two / "best")["adapter_only"]


def test_nonfinite_steps_are_skipped_and_the_gradient_norm_is_global_under_fsdp(tmp_path):
    script = str(Path(__file__).with_name("fsdp_nonfinite.py"))

    def report(cmd: list[str]) -> dict:
        res = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
        return json.loads(next(line for line in res.stdout.splitlines() if line.startswith("{")))

    one = report([sys.executable, script, str(tmp_path / "one"), "ddp"])
    two = report([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                  script, str(tmp_path / "two"), "fsdp"])  # fmt: skip
    assert one["changed"] == two["changed"] == [1, 4]  # the NaN steps 2 and 3 left every shard as it was
    assert one["skipped"] == two["skipped"] == [2, 3]
    assert abs(one["norm1"] - two["norm1"]) < 1e-5 * one["norm1"]  # the norm over both ranks' shards


def test_train_device_cuda_means_each_ranks_own_gpu(monkeypatch):
    """`--train.device=cuda` under torchrun: the rank's local GPU, with an index (a one-GPU FSDP group's
    torch.cuda.set_device refuses a device without one)."""
    from lmforge.train.device import pick_device
    from lmforge.train.distributed import DistInfo

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("cuda", DistInfo()) == torch.device("cuda", 0)
    assert pick_device("cuda", DistInfo(rank=3, world_size=4, local_rank=1)) == torch.device("cuda", 1)
    assert pick_device("cuda:0", DistInfo(rank=3, world_size=4, local_rank=1)) == torch.device("cuda", 0)


def test_a_save_published_before_another_process_died_is_reported_as_saved(tmp_path, monkeypatch):
    """Rank 1 killed after writing and hashing its shards, before the save's last barrier: rank 0 has published a
    whole checkpoint, and says so instead of "could not save" (simulated in one process: the world of two is the
    collectives' answer)."""
    import torch.distributed as dist

    from lmforge.checkpoint import sharded as dcp_mod
    from lmforge.train.distributed import DistInfo

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()

        def gather(out, mine, group=None):  # rank 1 wrote no shard files of its own here
            out[:] = [mine, {}]

        def barrier(*args, **kwargs):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")

        monkeypatch.setattr(dcp_mod.dist, "all_gather_object", gather)
        monkeypatch.setattr(dcp_mod.dist, "barrier", barrier)
        saver = dcp_mod.ShardedCheckpoints(DistInfo(rank=0, world_size=2), async_save=False)
        with pytest.raises(LMForgeError) as e:
            saver.save(tmp_path, 30, model, optimizer, model, config={"model": {}}, tokenizer=None,
                       train_state={"step": 30}, keep_last=3)  # fmt: skip
        final = tmp_path / "checkpoints" / "step_30"
        assert str(e.value) == (
            f"checkpoint step_30 is saved in {final}, but another process stopped during the save: "
            "RuntimeError: Connection closed by peer [127.0.0.1]:29500"
        )
        assert verify_checkpoint(final) is None
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()


def test_a_plain_run_does_not_import_distributed_checkpointing():
    # torch.distributed.checkpoint costs ~0.6 s to import: only sharded checkpoints need it.
    script = "import sys, lmforge.pretraining.run\nassert 'torch.distributed.checkpoint' not in sys.modules\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
