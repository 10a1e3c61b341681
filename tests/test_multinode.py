"""More than one node, on this machine: two torchrun launchers, each one "node" of `--nnodes=2` found through a c10d
rendezvous on 127.0.0.1 (gloo on CPUs), train one fsdp run into one run dir; the run, stopped after step 2,
resumes on one node with one process and the global batch kept, with the losses of the uninterrupted two-node run
(the promise of docs/distributed.md, "More than one machine"). Nodes that each see their own run dir are refused
with one line on every node, before any work."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_testing import ENV as BASE_ENV
from process_testing import free_port

from lmforge.checkpoint.layout import MANIFEST_FILE, list_checkpoints
from lmforge.checkpoint.verify import latest_checkpoint

ENV = dict(BASE_ENV)
if Path("/sys/class/net/lo").exists():  # gloo's sockets on the loopback, whatever the host name resolves to
    ENV["GLOO_SOCKET_IFNAME"] = "lo"
TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.seq_len=32", "--train.warmup_steps=3"]
TINY += ["--train.log_every=1", "--train.eval_every=100", "--train.max_steps=6", "--train.save_every=2"]
TINY += ["--train.deterministic", "--sample.prompts=[]", "--train.eval_batches=2"]
TOL = 2e-5
"""Losses are logged to 6 significant digits; one process differs from two only in the order of float sums."""
DEADLINE = 180
"""Seconds a launch may take (about 15 on 2 idle cores) before its processes are killed and the test fails."""

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to stop the launchers' workers")


def args(prepared, run: Path, *extra: str) -> list[str]:
    tok, data = prepared
    return ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY, *extra]


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a launcher's workers, each in a session of its own)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher still running and its workers' process groups (torchrun starts each worker with a session
    of its own, so killing the launcher alone would leave them waiting on their peers)."""
    if proc.poll() is not None:
        return
    for worker in children(proc.pid):
        try:
            os.killpg(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def two_nodes(prepared, runs: tuple[Path, Path], *extra: str, cwd: Path) -> list[tuple[int, str]]:
    """One torchrun launcher per "node" (`--nnodes=2 --nproc_per_node=1`, the same command but for the run dir),
    meeting at a c10d rendezvous on a free port → each launcher's (exit code, stderr)."""
    port = free_port()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=multinode-{port}",
                "--local-addr=127.0.0.1", "--rdzv-conf=join_timeout=60", "--max-restarts=0"]  # fmt: skip
    procs, logs = [], [cwd / f"node{i}.err" for i in range(2)]
    try:
        for run, log in zip(runs, logs):
            cmd = [*launcher, "-m", "lmforge.cli", *args(prepared, run, *extra)]
            with open(log, "w") as err:
                out = subprocess.DEVNULL
                procs.append(subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=out, stderr=err, start_new_session=True))
        end = time.monotonic() + DEADLINE
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            time.sleep(0.2)
        late = [i for i, p in enumerate(procs) if p.poll() is None]
        assert not late, f"node(s) {late} still running after {DEADLINE} s:\n" + logs[late[0]].read_text()[-4000:]
    finally:
        for p in procs:
            kill_launch(p)
    return [(p.returncode, log.read_text()) for p, log in zip(procs, logs)]


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "skipped" not in r}


def stop_after(run: Path, step: int) -> None:
    """Make `run` what a run killed right after checkpoint `step` leaves: no later checkpoints, no later lines."""
    for c in list_checkpoints(run):
        if int(c.name.split("_")[1]) > step:
            shutil.rmtree(c)
    log = run / "metrics.jsonl"
    kept = [line for line in log.read_text().splitlines() if json.loads(line).get("step", 0) <= step]
    log.write_text("".join(f"{line}\n" for line in kept))


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(30)


@pytest.mark.slow
def test_two_nodes_train_one_run_that_resumes_on_one_node(prepared, tmp_path):
    two = tmp_path / "two"
    done = two_nodes(prepared, (two, two), "--train.batch_size=4", "--train.parallel=fsdp", cwd=tmp_path)
    assert [rc for rc, _ in done] == [0, 0], "\n".join(err[-3000:] for _, err in done)
    uninterrupted = losses(two)
    assert sorted(uninterrupted) == [1, 2, 3, 4, 5, 6]
    # Both nodes' ranks wrote their shards into the one run dir, and rank 0 published each checkpoint whole.
    assert [c.name for c in list_checkpoints(two)] == ["step_2", "step_4", "step_6"]
    for c in list_checkpoints(two):
        assert sorted(p.name for p in (c / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        manifest = json.loads((c / MANIFEST_FILE).read_text())["files"]
        assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp"} <= set(manifest)
    assert not [p.name for p in two.iterdir() if p.name.startswith(".shared-probe")]

    # Stopped after step 2, the run continues on 1 node × 1 process with the same global batch (1 × 8 = 2 × 4).
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    stop_after(resumed, 2)
    res = subprocess.run([sys.executable, "-m", "lmforge.cli", *args(prepared, resumed, "--train.batch_size=8",
                          "--train.parallel=fsdp", "--resume")], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=DEADLINE)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"resumed from {resumed / 'checkpoints' / 'step_2'} at step 2 " in res.stderr
    trained = [int(line.split()[1].split("/")[0]) for line in res.stderr.splitlines() if line.startswith("step ")]
    assert trained == [3, 4, 5, 6]
    after = losses(resumed)
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    assert max(abs(after[s] - uninterrupted[s]) for s in range(1, 7)) < TOL, (after, uninterrupted)
    assert (latest_checkpoint(resumed) / "dcp" / "__0_0.distcp").is_file()


@pytest.mark.slow
def test_nodes_that_each_see_their_own_run_dir_are_refused_on_every_node(prepared, tmp_path):
    apart = (tmp_path / "node0" / "run", tmp_path / "node1" / "run")  # one path per node, as two local disks
    done = two_nodes(prepared, apart, "--train.batch_size=4", cwd=tmp_path)
    host = socket.gethostname()
    for (rc, err), run in zip(done, apart):
        line = (f"error: run dir {run} is not one directory for every node: rank 1 on {host} does not see the file "
                f"rank 0 on {host} wrote in it; a run over several nodes needs its run dir on a filesystem every "
                "node mounts at the same path (NFS, Lustre, ...): choose such a --run.dir")  # fmt: skip
        assert rc != 0 and err.splitlines().count(line) == 1, err[-3000:]
        assert "Traceback" not in err.split(line)[0]  # the worker stops with the line, before any work
    # The run dir rank 0 locked holds no step, no metrics and no probe; the other node's was never made.
    made = [run for run in apart if run.exists()]
    assert len(made) == 1
    assert sorted(p.name for p in made[0].iterdir()) == [".lock"]
