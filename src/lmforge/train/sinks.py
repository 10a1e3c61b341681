"""Metric sinks beside RUN/metrics.jsonl (`train.log_to`): TensorBoard, Weights & Biases and MLflow.

Each is an optional dependency (lmforge's extras of the same name), imported only when a run asks for it; a
missing one is refused with one line before any work (`check_sinks`). A sink gets every record that metrics.jsonl
gets, numbers only, with the record's step.

- tensorboard: event files in RUN/tensorboard/ (`tensorboard --logdir RUN/tensorboard`); a resumed run purges the
  events logged after its checkpoint.
- wandb: one W&B run per run dir (its id kept in RUN/wandb-run-id, so a resumed run continues it), named after the
  run dir, with the run's resolved config as its config; W&B's files in RUN/wandb/, or in WANDB_DIR when it is set.
  W&B's own settings apply: WANDB_PROJECT (default "lmforge"), WANDB_ENTITY, WANDB_MODE=offline (then
  `wandb sync RUN/wandb/offline-run-*`). Records are plotted against the lmforge step (the `step` metric), so a
  resumed run's repeated steps are kept.
- mlflow: one MLflow run per run dir (its id kept in RUN/mlflow-run-id), the resolved config's values as parameters
  and as a config.yaml artifact, in experiment MLFLOW_EXPERIMENT_NAME (default "lmforge") of MLFLOW_TRACKING_URI
  (a server, a database); without that variable, in the SQLite store RUN/mlflow.db (the `mlflow` extra brings
  mlflow-skinny with SQLAlchemy and Alembic, which that store needs), which MLflow reads as is, its artifacts in
  RUN/mlflow-artifacts. Its UI comes with
  `pip install mlflow`, not mlflow-skinny: the run says so in one note (`MLFLOW_NOTE`). MLflow keeps every logged
  point, so steps repeated after a resume appear twice in its history.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from lmforge.errors import LMForgeError
from lmforge.extras import check, require
from lmforge.files import write_atomic
from lmforge.progress import is_quiet, status

TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb-run-id"
MLFLOW_ID_FILE = "mlflow-run-id"
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlflow-artifacts"
MLFLOW_NOTE = (
    "note: MLflow logs to {store}; to see it: pip install mlflow (the UI; lmforge's `mlflow` extra is mlflow-skinny, "
    "which has none), then mlflow ui --backend-store-uri {store}"
)
"""Said when a run logs to its own store (no MLFLOW_TRACKING_URI): how to read it with MLflow's UI."""


def mlflow_store(run_dir: Path) -> str:
    """The tracking URI of a run's own MLflow store, RUN/mlflow.db."""
    return f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"


MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""Sink name → the module it needs (lmforge's extra of the same name)."""


class Sink(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def check_sinks(names: list[str] | tuple[str, ...], key: str = "train.log_to") -> None:
    """Refuse, in one line, a sink that is unknown or whose package is not installed (called before any work;
    `key`: the config key that names the sinks)."""
    for name in names:
        if name not in MODULES:
            raise LMForgeError(f"{key}: unknown sink '{name}' (known: {', '.join(MODULES)})")
        check(f"{key}={name}", MODULES[name])


def open_sinks(
    names: list[str] | tuple[str, ...], run_dir: Path, resume_step: int | None = None, config: dict | None = None
) -> list[Sink]:
    """The sinks named, opened for `run_dir` (a resumed run continues where its checkpoint was); `config`: the run's
    resolved config (default: RUN/config.yaml when it is there)."""
    check_sinks(names)
    opened: list[Sink] = []
    try:
        for name in dict.fromkeys(names):  # each once
            opened.append(_OPEN[name](Path(run_dir), resume_step, config))
    except BaseException:
        for sink in opened:
            sink.close()
        raise
    return opened


def _run_config(run_dir: Path, config: dict | None) -> dict[str, Any]:
    """`config`, else the run's RUN/config.yaml, else {}."""
    if config is not None:
        return config
    path = run_dir / "config.yaml"
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _saved_id(path: Path, resume_step: int | None) -> str | None:
    """The sink's run id written by an earlier attempt of this run, when this one resumes it."""
    if resume_step is None or not path.is_file():
        return None
    return path.read_text(encoding="utf-8").strip() or None


class TensorBoardSink:
    """TensorBoard event files in RUN/tensorboard (events after `resume_step` from an earlier attempt are purged)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, config: dict | None = None) -> None:
        check("train.log_to=tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=resume_step or None)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run (see the module docstring)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, config: dict | None = None) -> None:
        wandb = require("wandb", "train.log_to=wandb")
        if is_quiet():  # --quiet: W&B's own status lines too
            os.environ.setdefault("WANDB_SILENT", "true")
        id_file = run_dir / WANDB_ID_FILE
        run_id = _saved_id(id_file, resume_step)
        where = None if os.environ.get("WANDB_DIR") else str(run_dir)  # the user's WANDB_DIR wins over ours
        if where is not None:
            (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "lmforge"), name=run_dir.resolve().name, dir=where,
                config=_run_config(run_dir, config), id=run_id, resume="allow" if run_id else None,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 — W&B raises its own types for a missing login, a refused server, ...
            raise LMForgeError(f"train.log_to=wandb: W&B could not start a run: {str(e).splitlines()[0]}") from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        write_atomic(id_file, self.run.id + "\n")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"step": step, **values})

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run (see the module docstring)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, config: dict | None = None) -> None:
        tracking = require("mlflow.tracking", "train.log_to=mlflow")
        self.entities = require("mlflow.entities", "train.log_to=mlflow")
        own = not os.environ.get("MLFLOW_TRACKING_URI")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow_store(run_dir)
        if uri.startswith("file:"):  # a file store the user named: MLflow 3 refuses it unless this is set
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for name in ("mlflow.store.db.utils", "alembic"):  # its table creation speaks at INFO on stderr
            logging.getLogger(name).setLevel(logging.WARNING)
        id_file = run_dir / MLFLOW_ID_FILE
        try:
            self.client = tracking.MlflowClient(uri)
            self.run_id = _saved_id(id_file, resume_step) or self._new_run(run_dir, _run_config(run_dir, config), own)
            if resume_step is not None:
                self.client.update_run(self.run_id, status="RUNNING")
        except Exception as e:  # noqa: BLE001 — MLflow raises its own types for a refused server, a bad URI, ...
            raise LMForgeError(f"train.log_to=mlflow: MLflow could not start a run: {str(e).splitlines()[0]}") from None
        write_atomic(id_file, self.run_id + "\n")
        if own:
            status(MLFLOW_NOTE.format(store=shlex.quote(f"sqlite:///{run_dir / MLFLOW_DB}")))

    def _new_run(self, run_dir: Path, config: dict[str, Any], own: bool) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "lmforge")
        exp = self.client.get_experiment_by_name(name)
        # A database store keeps artifacts in ./mlruns of the working directory unless told: the run's own go in it.
        where = (run_dir / MLFLOW_ARTIFACTS).resolve().as_uri() if own else None
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name, artifact_location=where)
        run_id = self.client.create_run(exp_id, run_name=run_dir.resolve().name).info.run_id
        params = [self.entities.Param(k, str(v)[:500]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(run_id, params=params[i : i + 100])
        if config:  # the config as the run's config.yaml artifact
            self.client.log_text(run_id, yaml.safe_dump(config, sort_keys=False, allow_unicode=True), "config.yaml")
        return run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.entities.Metric(k, float(v), now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_OPEN = {"tensorboard": TensorBoardSink, "wandb": WandbSink, "mlflow": MlflowSink}
