"""`train.log_to` sinks beside metrics.jsonl: W&B (offline) and MLflow (a file store) get every numeric record with
its step, read back here through their own formats; a resumed run continues the same tracking run; a missing
package or an unknown sink is one line before any work."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from pathlib import Path

import pytest
from training_testing import make_prepared, restore_torch_globals

from lmforge.cli import main
from lmforge.errors import LMForgeError
from lmforge.train.metrics import MetricsLogger
from lmforge.train.sinks import MLFLOW_ID_FILE, WANDB_ID_FILE, check_sinks, mlflow_store

needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """W&B offline with its settings and cache in tmp_path; MLflow on its default (the run dir's file store)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    yield from restore_torch_globals()


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline W&B run file (the LevelDB-style log that `wandb sync` uploads: a 7-byte
    ':W&B' header, then 32 KiB blocks of crc/length/type-framed chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            out.append(pb.Record())
            out[-1].ParseFromString(chunk)
            chunk = b""
    return out


def wandb_history(run_dir: Path, attempts: int = 1) -> list[dict]:
    """The history rows of the offline W&B run files under RUN/wandb, once `attempts` of them are complete: W&B's
    service process writes them after `finish()` returns, so this waits (up to a minute) for each one's exit record."""
    deadline = time.monotonic() + 60
    while True:
        files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        records = [wandb_records(f) for f in files]
        done = [r for r in records if r and r[-1].WhichOneof("record_type") == "exit"]
        if len(done) >= attempts or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(files) == len(done) == attempts, f"{len(files)} W&B run files, {len(done)} complete"
    rows = []
    for record in (r for rs in records for r in rs if r.WhichOneof("record_type") == "history"):
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        rows.append({k: v for k, v in row.items() if not k.startswith("_")})
    return rows


def mlflow_history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_store(run_dir))
    return sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run_id(run_dir), key))


def mlflow_run_id(run_dir: Path) -> str:
    return (run_dir / MLFLOW_ID_FILE).read_text().strip()


def log_steps(run_dir: Path, sinks: list[str], steps: range, resume_step: int | None = None) -> None:
    with MetricsLogger(run_dir, resume_step=resume_step, sinks=sinks) as log:
        for s in steps:
            log.log(s, loss=1.0 / s, lr=0.5, note="text is not sent to a sink", flag=True)


@needs_wandb
def test_wandb_offline_gets_every_record_and_a_resumed_run_continues_the_same_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("train:\n  lr: 0.5\n")
    log_steps(run_dir, ["wandb"], range(1, 4))
    first_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    assert wandb_history(run_dir) == [{"step": s, "loss": pytest.approx(1.0 / s), "lr": 0.5} for s in (1, 2, 3)]
    # W&B names an attempt's directory by its start second: a resume (a new process) never starts in the second
    # the first attempt did, but this one, in the same process, could.
    time.sleep(1.01 - time.time() % 1)
    log_steps(run_dir, ["wandb"], range(3, 5), resume_step=2)  # the resumed attempt logs step 3 again, then 4
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == first_id
    assert [r["step"] for r in wandb_history(run_dir, attempts=2)] == [1, 2, 3, 3, 4]
    run_files = list(run_dir.glob(f"wandb/offline-run-*-{first_id}/run-{first_id}.wandb"))
    assert len(run_files) == 2  # two attempts, one W&B run id: `wandb sync` uploads both into the one run


@needs_mlflow
def test_mlflow_own_store_gets_every_record_params_and_config_and_a_resume_continues_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("train:\n  lr: 0.5\nmodel:\n  preset: gpt-tiny\n")
    log_steps(run_dir, ["mlflow"], range(1, 4))
    assert mlflow_history(run_dir, "loss") == [(s, pytest.approx(1.0 / s)) for s in (1, 2, 3)]
    assert mlflow_history(run_dir, "lr") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    client = MlflowClient(mlflow_store(run_dir))
    run_id = (run_dir / MLFLOW_ID_FILE).read_text().strip()
    run = client.get_run(run_id)
    assert run.data.params == {"train.lr": "0.5", "model.preset": "gpt-tiny"}
    assert set(run.data.metrics) == {"loss", "lr"} and run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "lmforge" and run.info.run_name == "run"
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.yaml"]
    assert list((run_dir / "mlflow-artifacts").rglob("config.yaml"))  # in the run dir, not ./mlruns of the cwd
    log_steps(run_dir, ["mlflow"], range(3, 5), resume_step=2)
    assert (run_dir / MLFLOW_ID_FILE).read_text().strip() == run_id
    assert [s for s, _ in mlflow_history(run_dir, "loss")] == [1, 2, 3, 3, 4]


@needs_mlflow
def test_mlflow_logs_to_the_tracking_uri_and_experiment_the_environment_names(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "shared-store").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "sweep-7")
    log_steps(tmp_path / "a", ["mlflow"], range(1, 3))
    log_steps(tmp_path / "b", ["mlflow"], range(1, 2))
    assert not (tmp_path / "a" / "mlflow.db").exists()
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("sweep-7")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]


def test_a_sink_whose_package_is_missing_is_one_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(LMForgeError) as e:
        check_sinks(["wandb"])
    assert str(e.value) == (
        "train.log_to=wandb needs wandb, which is not installed (lmforge's `wandb` extra): pip install 'wandb>=0.17'"
    )
    with pytest.raises(
        LMForgeError, match=r"^train.log_to: unknown sink 'neptune' \(known: tensorboard, wandb, mlflow\)$"
    ):
        check_sinks(["neptune"])


def test_the_cli_refuses_a_missing_sink_package_before_any_work(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    run_dir = tmp_path / "run"
    rc = main(["pretrain", "gpt", f"--run.dir={run_dir}", "--model.preset=gpt-tiny", "--train.log_to=mlflow"])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.splitlines()[-1] + "\n" == (
        "error: train.log_to=mlflow needs mlflow-skinny, which is not installed (lmforge's `mlflow` extra): "
        "pip install 'mlflow-skinny>=2.14'\n"
    )
    assert not (run_dir / "tokenizer").exists() and not (run_dir / "checkpoints").exists()


@needs_wandb
@needs_mlflow
def test_pretrain_logs_to_wandb_and_mlflow_what_it_writes_to_metrics_jsonl(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    tok, data = make_prepared(tmp_path / "p", 12)
    run_dir = tmp_path / "run"
    rc = main(["pretrain", "gpt", f"--run.dir={run_dir}", f"--data.tokenizer={tok}", f"--data.prepared={data}",
               "--model.preset=gpt-tiny", "--train.seq_len=32", "--train.batch_size=4", "--train.max_steps=4",
               "--train.log_every=2", "--train.log_to=[wandb,mlflow]", "--sample.prompts=[]",
               "--train.eval_batches=1"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    logged = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in logged if "loss" in r]
    assert [s for s, _ in losses] == [2, 4]
    assert [(r["step"], r["loss"]) for r in wandb_history(run_dir) if "loss" in r] == losses
    assert [(s, pytest.approx(v)) for s, v in mlflow_history(run_dir, "loss")] == losses
    val = [(r["step"], r["val_loss"]) for r in logged if "val_loss" in r]
    assert val and mlflow_history(run_dir, "val_loss") == [(s, pytest.approx(v)) for s, v in val]
    from mlflow.tracking import MlflowClient

    params = MlflowClient(mlflow_store(run_dir)).get_run(mlflow_run_id(run_dir)).data.params
    assert params["train.max_steps"] == "4" and params["model.name"] == "gpt-tiny"  # the resolved config


@needs_mlflow
def test_a_tracking_run_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://tracking")
    with pytest.raises(LMForgeError) as e:
        MetricsLogger(tmp_path, sinks=["mlflow"])
    assert str(e.value).startswith("train.log_to=mlflow: MLflow could not start a run: ")
    assert "\n" not in str(e.value) and "nosuchscheme" in str(e.value)
