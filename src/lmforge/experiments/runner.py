"""Run many runs ("arms") as `lmforge pretrain`, `lmforge finetune` and `lmforge eval` subprocesses: one at a time
or `jobs` at once, each an ordinary run dir, an arm starting once the arms it needs (its `after`: the run it
continues or fine-tunes) have finished. A finished arm is skipped: a pretraining run whose metrics.jsonl holds a
validation loss at its final step, a fine-tuning run with its eval.json, an evaluation with its results file. A
fine-tuning run that finishes drops its resumable checkpoints (its best/ checkpoint and results stay). An arm
killed midway continues from its latest checkpoint (the same overrides again, with --resume). The arms stop with the
runner, however it dies (`_Lifeline`), and a rerun that finds an arm's run dir still held by a live process waits
for it instead of failing the arm."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import LOG_FILE, STAGES, Arm, ArmResult, arm_command, arm_final, has_checkpoint, summary
from lmforge.files import append_text
from lmforge.progress import status
from lmforge.train.signals import LIFELINE_ENV, Stopped


def failure_reason(log: Path, returncode: int) -> str:
    """Why an arm's process failed: its last error line; else, killed by a signal, which one (the kernel's OOM killer
    sends SIGKILL and leaves no line of its own); else its last line."""
    try:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    errors = [x for x in lines if x.startswith("error:")]
    if errors:
        return errors[-1][:300]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}" + (" (out of memory? the kernel's OOM killer sends it)" if name == "SIGKILL" else "")
    return (lines or ["no output"])[-1][:300]


def _launch(arm: Arm, device: str | None, threads: str, lifeline: _Lifeline) -> tuple[subprocess.Popen, float]:
    arm.run_dir.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": threads} | dict(os.environ)  # status lines (resumes, notes) go to the arm log
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    log = append_text(arm.run_dir / LOG_FILE)  # closed when the arm ends
    proc = subprocess.Popen(arm_command(arm), stdout=log, stderr=subprocess.STDOUT, **lifeline.popen_args(env))
    proc.log = log  # type: ignore[attr-defined]
    return proc, time.monotonic()


class _Lifeline:
    """A pipe whose write end only the runner holds; each arm gets the read end (LIFELINE_ENV). When the runner
    dies, however (kill -9 included), the kernel closes it, and each arm stops as on SIGTERM, saving a checkpoint
    (`train.signals.stop_with_starter`), instead of training on as an orphan that holds its run dir against the
    rerun. (Linux's PR_SET_PDEATHSIG would not do: it follows the runner's threads, so a killed runner with busy
    threads signals its arm two or three times, and a second SIGTERM stops a run at once, without its checkpoint.)"""

    def __init__(self) -> None:
        self.read, self.write = os.pipe() if os.name == "posix" else (None, None)

    def popen_args(self, env: dict[str, str]) -> dict[str, Any]:
        if self.read is None:
            return {"env": env}
        return {"env": env | {LIFELINE_ENV: str(self.read)}, "pass_fds": (self.read,)}

    def close(self) -> None:
        for fd in (self.read, self.write):
            if fd is not None:
                os.close(fd)
        self.read = self.write = None


def _in_use(arm: Arm, waiting: set[str]) -> bool:
    """Whether a live process still holds the arm's run dir (an arm of an earlier runner that was killed: it is
    stopping, or finishing on its own); said once per arm. The arm starts once the dir is free."""
    from lmforge.checkpoint.rundir import lock_holder

    holder = lock_holder(arm.run_dir)
    if holder is None:
        waiting.discard(arm.name)
        return False
    if arm.name not in waiting:
        status(f"{arm.name}: waiting for {holder}, which still runs in {arm.run_dir}")
        waiting.add(arm.name)
    return True


def run_arms(arms: list[Arm], jobs: int = 1, devices: list[str] | None = None, poll_s: float = 0.5) -> list[ArmResult]:
    """Run every unfinished arm (at most `jobs` at once; with `devices`, job slot i sees only GPU devices[i %
    len(devices)]), each once the arms it needs have finished, and return one result per arm, in order. A failure
    does not stop the other arms; the arms that need a failed one fail without running."""
    if jobs < 1:
        raise LMForgeError(f"--jobs must be >= 1, got {jobs}")
    _check_names(arms)
    results: dict[str, ArmResult] = {}
    todo = []
    for arm in arms:
        final = arm_final(arm)
        if final is not None:
            results[arm.name] = ArmResult(arm, "skipped", final)
        else:
            todo.append(arm)
    if len(todo) < len(arms):
        status(f"{len(arms) - len(todo)} of {len(arms)} arms already finished: skipped")
    running: dict[int, tuple[Arm, subprocess.Popen, float]] = {}  # slot -> arm
    waiting: set[str] = set()  # arms whose run dir another process still holds
    total, started = len(todo), 0
    threads = str(max(1, (os.cpu_count() or 1) // jobs))  # CPU runs: no more threads than cores
    on_term = _stop_on_sigterm()
    lifeline = _Lifeline()
    try:
        while todo or running:
            _fail_orphans(todo, results)
            unstarted = False  # an arm that could not start frees its slot for the next one
            for slot in range(jobs):
                if slot in running or any(a.procs > 1 for a, _, _ in running.values()):
                    continue  # a run on several processes has the machine to itself
                arm = _next_ready(todo, results, lambda a: not _in_use(a, waiting))
                if arm is None or arm.procs > 1 and running:
                    continue  # it starts once the running arms have ended; nothing else starts before it
                todo.remove(arm)
                final = arm_final(arm)  # the process it waited for may have finished the run
                if final is not None:
                    results[arm.name] = ArmResult(arm, "skipped", final)
                    continue
                device = devices[slot % len(devices)] if devices else None
                if devices and arm.procs > 1:
                    device = ",".join(devices[: arm.procs])
                started += 1
                verb = "resuming" if has_checkpoint(arm.run_dir) else "starting"
                status(f"[{started}/{total}] {verb} {arm.name} ({arm.run_dir})")
                try:
                    running[slot] = (arm, *_launch(arm, device, threads, lifeline))
                except OSError as e:  # a full disk, say: this arm fails, the running ones go on
                    error = f"could not start: {e.strerror or e} ({e.filename or arm.run_dir})"
                    status(f"{arm.name}: failed: {error}")
                    results[arm.name] = ArmResult(arm, "failed", error=error)
                    unstarted = True
            if todo and not running and not waiting and not unstarted:  # none can start: a cycle among their `after`
                raise LMForgeError(f"arm {todo[0].name} waits for arms that never run: {', '.join(todo[0].after)}")
            time.sleep(poll_s)
            for slot, (arm, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                proc.log.close()  # type: ignore[attr-defined]
                del running[slot]
                results[arm.name] = _finish(arm, proc.returncode, time.monotonic() - t0)
    except (KeyboardInterrupt, _Terminated) as e:
        signum = e.signum if isinstance(e, _Terminated) else signal.SIGINT
        raise Stopped(
            f"stopped by {signal.Signals(signum).name}: {len(running)} running arm(s) stopped (a training arm saves a "
            "checkpoint first); rerun the same command to continue: finished arms are skipped, stopped ones resume",
            signum,
        ) from None
    finally:  # interrupted: stop the arms still running (a rerun resumes them from their checkpoints)
        for _, proc, _ in running.values():
            proc.terminate()
            proc.wait()
            proc.log.close()  # type: ignore[attr-defined]
        lifeline.close()  # after the arms are gone: closing it earlier would signal them a second time
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    return [results[a.name] for a in arms]


def spread_pretraining(arms: list[Arm], procs: int, devices: list[str] | None) -> None:
    """Train each pretraining arm on `procs` processes (the first `procs` of `devices`), its train.batch_size the
    global batch; one-line errors for what cannot be cut that way."""
    if procs < 1:
        raise LMForgeError(f"--pretrain-procs must be >= 1, got {procs}")
    if procs > 1 and devices and len(devices) < procs:
        raise LMForgeError(f"--pretrain-procs {procs} needs as many --devices, got {len(devices)}: {','.join(devices)}")
    for arm in arms:
        if STAGES[arm.kind].spreads and procs > 1:
            if arm.info["batch_size"] % procs:
                raise LMForgeError(f"{arm.name}: train.batch_size {arm.info['batch_size']} (the global batch) does not "
                                   f"divide into --pretrain-procs {procs} processes")  # fmt: skip
            arm.procs = procs


def _check_names(arms: list[Arm]) -> None:
    """Arm names are unique, and every arm an arm needs is one of them."""
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise LMForgeError("arm names must be unique")
    for arm in arms:
        missing = [n for n in arm.after if n not in names]
        if missing:
            raise LMForgeError(f"arm {arm.name} needs {missing[0]}, which is not an arm of this run")


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def _stop_on_sigterm():
    """SIGTERM (a scheduler's preemption) interrupts the runner as Ctrl-C does, so its arms are stopped with it
    rather than left running; returns the handler to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handle(signum: int, frame) -> None:
        raise _Terminated(signum)

    return signal.signal(signal.SIGTERM, handle)


def _next_ready(todo: list[Arm], results: dict[str, ArmResult], free: Callable[[Arm], bool]) -> Arm | None:
    """The first waiting arm whose `after` arms have all finished and whose run dir is `free` (left in `todo`)."""
    for arm in todo:
        if all(n in results and results[n].state != "failed" for n in arm.after) and free(arm):
            return arm
    return None


def _fail_orphans(todo: list[Arm], results: dict[str, ArmResult]) -> None:
    """Waiting arms that need a failed arm fail too (repeatedly, down chains of arms)."""
    changed = True
    while changed:
        changed = False
        for arm in list(todo):
            bad = [n for n in arm.after if n in results and results[n].state == "failed"]
            if bad:
                todo.remove(arm)
                results[arm.name] = ArmResult(arm, "failed", error=f"not run: {bad[0]} failed")
                changed = True


def _finish(arm: Arm, returncode: int, seconds: float) -> ArmResult:
    final = arm_final(arm) if returncode == 0 else None
    if final is None:
        error = failure_reason(arm.run_dir / LOG_FILE, returncode) if returncode else "finished without its results"
        status(f"{arm.name}: failed after {seconds:.0f} s: {error}")
        return ArmResult(arm, "failed", None, seconds, error)
    status(f"{arm.name}: {summary(arm, final)} after {seconds:.0f} s")
    if STAGES[arm.kind].drops_checkpoints:
        from lmforge.checkpoint.layout import CHECKPOINTS_DIR

        shutil.rmtree(arm.run_dir / CHECKPOINTS_DIR, ignore_errors=True)
    return ArmResult(arm, "finished", final, seconds)


def check_all_finished(results: list[ArmResult]) -> None:
    """Raise one line naming the failed arms and where their logs are."""
    failed = [r for r in results if r.state == "failed"]
    if failed:
        first = next((r for r in failed if not r.error.startswith("not run:")), failed[0])
        raise LMForgeError(
            f"{len(failed)} of {len(results)} arms failed ({', '.join(r.arm.name for r in failed)}); "
            f"{first.arm.name}: {first.error} (log: {first.arm.run_dir / LOG_FILE}); rerun to retry them"
        )
