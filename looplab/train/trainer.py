"""The training loop: AdamW, warmup + cosine, clipping, logs, checkpoints, exact resume.

Resume is exact on CPU: the batch and depths of step s come from a generator
derived from (seed, "train", s), and the model and AdamW state are restored
bit for bit, so an interrupted run ends with the same weights as an
uninterrupted one.

Under torchrun the same loop trains data-parallel (``distributed.py``): each
rank trains its shard of the global batch, gradients are averaged before
clipping, and rank 0 alone writes the run directory.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from looplab.checkpoint import latest_checkpoint, load_checkpoint, load_weights, read_state, save_checkpoint
from looplab.config import Config
from looplab.errors import LooplabError
from looplab.experiment import (
    Experiment,
    all_finite,
    check_device,
    check_pretrained_fits,
    checked,
    config_task,
    on_device,
    training_depth,
)
from looplab.io import atomic_write, exclusive_lock
from looplab.memory import check_fits, eval_bytes, training_bytes
from looplab.parallel import SINGLE, Parallel
from looplab.progress import ProgressLines
from looplab.regularisers import complete_stability
from looplab.rundir import LOG_FILE, check_run_dir_target, load_run_config, prepare_run_dir, read_log
from looplab.seeding import derive_generator
from looplab.tasks import make_task
from looplab.train.distributed import data_parallel
from looplab.train.gradients import optimisation_step
from looplab.train.stop import TrainingStopped, stop_on_signals


class TrainingDiverged(LooplabError):
    """The loss, a gradient or the weights became non-finite; the step was not applied or not saved,
    and the last good checkpoint is kept."""

    exit_code = 1


def make_optimizer(exp: Experiment) -> torch.optim.AdamW:
    """AdamW over the model and any learned-schedule module.

    Weight decay applies to matrices only (not norms or biases); a schedule's
    module (the halting head) learns at ``schedule.lr_scale`` × the model's lr.
    """
    config = exp.config
    groups = []
    for name, module in exp.modules().items():
        params = [p for p in module.parameters() if p.requires_grad]
        scale = exp.schedule.lr_scale if name == "schedule" else 1.0
        groups += [
            {
                "params": [p for p in params if p.dim() >= 2],
                "weight_decay": config.train.weight_decay,
                "lr_scale": scale,
            },
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr_scale": scale},
        ]
    return torch.optim.AdamW(groups, lr=config.train.lr, betas=(config.train.beta1, config.train.beta2))


def learning_rate(step: int, config: Config) -> float:
    """Linear warmup over ``warmup_steps``, then cosine from lr to min_lr_ratio·lr at the last step."""
    tr = config.train
    if step <= tr.warmup_steps:
        return tr.lr * step / max(1, tr.warmup_steps)
    progress = (step - tr.warmup_steps) / max(1, tr.steps - tr.warmup_steps)
    floor = tr.lr * tr.min_lr_ratio
    return floor + (tr.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class RunDirLost(LooplabError):
    """The run directory disappeared while training: nothing more can be saved."""

    exit_code = 1


def check_run_dir_present(run_dir: Path, step: int) -> None:
    """Raise :class:`RunDirLost` when ``run_dir`` is gone (deleted, unmounted) before step ``step`` is saved."""
    if not run_dir.is_dir():
        raise RunDirLost(f"run dir {run_dir} was removed during training, at step {step}: nothing more is saved")


@contextmanager
def quiet_writer_threads() -> Iterator[None]:
    """Keep an I/O error in TensorBoard's writer thread (its run dir deleted) from printing a traceback: the
    main thread reports the lost run dir in one line (:func:`check_run_dir_present`)."""
    previous = threading.excepthook

    def hook(args) -> None:
        if not isinstance(args.exc_value, OSError):
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


class RunLog:
    """JSONL log plus TensorBoard scalars; on resume, drops entries after the checkpoint."""

    def __init__(self, run_dir: Path, resume_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = run_dir
        self.path = run_dir / LOG_FILE
        if self.path.exists() and not self.path.is_file():
            raise LooplabError(f"{self.path} is not a file (a run's log is a JSONL file); move it away to resume")
        kept = [record for record in read_log(run_dir) if record.get("step", 0) <= resume_step]
        atomic_write(self.path, lambda tmp: tmp.write_text("".join(json.dumps(r) + "\n" for r in kept)))
        self.handle = open(self.path, "a")
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def write_eval(self, step: int, metrics: dict[str, float]) -> None:
        """Evaluation metrics at a checkpoint, as ``eval/*`` scalars."""
        check_run_dir_present(self.run_dir, step)
        for key, value in metrics.items():
            self.tensorboard.add_scalar(f"eval/{key}", value, step)
        self.tensorboard.flush()

    def write(self, record: dict) -> None:
        check_run_dir_present(self.run_dir, record["step"])
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"train/{key}", value, record["step"])

    def close(self) -> None:
        self.handle.close()
        try:
            self.tensorboard.close()
        except OSError:  # the run dir is gone: its events cannot be written, and the loss is reported already
            pass


def autocast(config: Config) -> torch.autocast:
    """bf16 autocast when ``run.precision = "bf16"``, a no-op context otherwise."""
    device_type = "cuda" if config.run.device.startswith("cuda") else "cpu"
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=config.run.precision == "bf16")


def train_step(exp: Experiment, optimizer: torch.optim.Optimizer, step: int, parallel: Parallel = SINGLE) -> dict:
    """One optimisation step on this rank's shard of the global batch; returns its scalar metrics.

    ``loss`` is the global batch's (the mean over ranks) and may be non-finite;
    the other metrics are this rank's.
    """
    cfg = exp.config
    generator = derive_generator(cfg.run.seed, "train", step)
    lengths = torch.randint(cfg.task.train_min, cfg.task.train_max + 1, (cfg.train.batch_size,), generator=generator)
    batch = parallel.shard(exp.training_task.sample_lengths(lengths, generator)).to(cfg.run.device)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, cfg) * group["lr_scale"]
    active = [
        (reg, found)
        for reg in exp.regularisers
        if (found := reg.generator_for(step, cfg.run.seed, parallel)) is not None
    ]
    with autocast(cfg):
        out = exp.schedule.training_loss(exp.model, batch, generator, probe=bool(active))

    def average_over_ranks() -> None:
        parallel.average_gradients(exp.modules())
        exp.schedule.load_state_dict(parallel.average_state(exp.schedule.state_dict()))

    # Clipped per module, so the halting head's gradients never rescale the model's.
    groups = {name: module.parameters() for name, module in exp.modules().items()}
    step_taken = optimisation_step(
        out, exp.model, active, optimizer, groups, cfg.train.grad_clip, parallel, average_over_ranks
    )
    if step_taken.grad_norms is None:
        return {"loss": step_taken.loss}
    if not step_taken.applied:
        bad = next(n for n in step_taken.grad_norms.values() if not math.isfinite(n))
        return {"loss": step_taken.loss, "grad_norm": bad}
    lr = optimizer.param_groups[0]["lr"]
    return {"loss": step_taken.loss, "lr": lr, "grad_norm": step_taken.grad_norms["model"], **step_taken.stats}


def checkpoint_metrics(exp: Experiment) -> dict[str, float]:
    """The headline metrics of a quick evaluation (``eval.checkpoint_samples`` per length) of the model as it is."""
    from looplab.eval.grid import evaluate_lengths
    from looplab.eval.metrics import headline_metrics, summarize

    cfg = exp.config
    outcomes = evaluate_lengths(
        exp.model,
        exp.task,
        exp.schedule,
        cfg.task.eval_lengths,
        cfg.eval.max_loops,
        cfg.eval.checkpoint_samples,
        cfg.eval.batch_size,
        cfg.run.seed,
    )
    return headline_metrics(summarize(outcomes, cfg.task.train_max, flip_from=cfg.eval.flip_from))


def _window_mean(window: list[dict]) -> dict:
    """Mean of each metric over the steps that report it (e.g. ``jsrr`` only on regularised steps)."""
    keys = dict.fromkeys(k for metrics in window for k in metrics)
    return {k: sum(m[k] for m in window if k in m) / sum(k in m for m in window) for k in keys}


def train(config: Config, run_dir: str | Path, progress: bool = True) -> Experiment:
    """Train (or resume) the run in ``run_dir``; returns the trained experiment.

    Under torchrun every rank calls this; each returns the same trained weights. ``config`` is checked
    (before anything is written) unless it already is (``looplab.experiment.checked``), and passed down checked.
    """
    run_dir = Path(run_dir)
    config = checked(config)
    check_device(config.run.device)
    task = config_task(config)
    if config.model.pretrained:  # a model dir's size is its own, not model.d_model's
        check_pretrained_fits(config, training=True)
    else:
        check_fits(
            "training",
            training_bytes(config, task, training_depth(config)),
            config.run.device,
            "use a smaller model.d_model, train.batch_size or training depth",
        )
    ev = config.eval
    if ev.checkpoint_samples > 0:  # the evaluation at every checkpoint, estimated before the first step
        check_fits(
            f"the checkpoint evaluations ({ev.checkpoint_samples} samples x {ev.max_loops} loops x "
            f"{len(config.task.eval_lengths)} lengths)",
            eval_bytes(config, task, config.task.eval_lengths, ev.max_loops, ev.checkpoint_samples),
            config.run.device,
            "use a smaller eval.max_loops or eval.checkpoint_samples",
        )
    if config.run.threads > 0:
        torch.set_num_threads(config.run.threads)
    check_run_dir_target(run_dir)
    source = init_checkpoint(config, run_dir)
    # Signals are recorded from here on, before the ranks meet: one that arrives while a rank is still
    # setting up stops every rank after the first step, instead of killing that rank mid-collective.
    with stop_on_signals(), data_parallel(config) as parallel, ExitStack() as held:
        # Rank 0 locks, creates or checks the run dir while the others wait, so every rank
        # then reads the same latest checkpoint; the lock is held until training ends.
        def claim() -> None:
            held.enter_context(exclusive_lock(run_dir, "run dir"))
            prepare_run_dir(run_dir, config, with_every_regulariser)

        parallel.on_main(claim)
        exp = Experiment.build(on_device(config, parallel.device), parallel)
        optimizer = make_optimizer(exp)
        start = 0
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, exp.modules(), optimizer)
            start = state["step"]
            exp.schedule.load_state_dict(state.get("schedule", {}))
        elif source is not None:  # a fine-tune's first start: the model's weights, not its optimizer
            load_weights(source, {"model": exp.model})
        exp.model.train()
        with quiet_writer_threads():
            log = RunLog(run_dir, start) if parallel.is_main else None
            try:
                _train_loop(exp, optimizer, run_dir, start, log, progress, parallel)
            finally:
                if log is not None:
                    log.close()
        parallel.barrier()  # no rank returns before rank 0's final checkpoint exists
    exp.model.eval()
    return exp


def with_every_regulariser(saved: dict) -> dict:
    """A saved config (sections as a dict) with a table for every registered regulariser: a run written
    before one was registered never applied it, so its table is that regulariser's defaults."""
    return {**saved, "stability": complete_stability(saved.get("stability", {}))}


def init_checkpoint(config: Config, run_dir: Path) -> Path | None:
    """The checkpoint ``train.init_from`` names (its run's latest), checked before anything is written:
    a run dir with a checkpoint, another than ``run_dir``, whose model config and vocabulary are this one's.
    None without ``init_from``, or when ``run_dir`` has a checkpoint of its own (a resume reads only that)."""
    if not config.train.init_from or (run_dir.is_dir() and latest_checkpoint(run_dir) is not None):
        return None
    source = Path(config.train.init_from)
    if source.resolve() == run_dir.resolve():
        raise LooplabError(f"train.init_from {source} is this run's own dir; a run resumes from itself anyway")
    theirs = load_run_config(source)
    checkpoint = latest_checkpoint(source)
    if checkpoint is None:
        raise LooplabError(f"train.init_from {source} holds no checkpoint yet")
    read_state(checkpoint)
    differ = [key for key, value in asdict(config.model).items() if asdict(theirs.model).get(key) != value]
    if differ:
        raise LooplabError(
            f"train.init_from {source} has another model: model.{', model.'.join(differ)} differ; "
            "fine-tuning keeps the model's shape"
        )
    ours, its = (make_task(c.task.name, c.task.alphabet).vocab_size for c in (config, theirs))
    if ours != its:
        raise LooplabError(f"train.init_from {source} reads a vocabulary of {its} tokens, this run's task {ours}")
    return checkpoint


def start_line(exp: Experiment, run_dir: Path, start: int, parallel: Parallel) -> str:
    """What a run is about to do: where, how big, on what, and which steps (or that none are left)."""
    steps = exp.config.train.steps
    size = sum(p.numel() for module in exp.modules().values() for p in module.parameters())
    where = f"train: {run_dir}, {size:,} parameters, {parallel.device}"
    where += (
        f" x {parallel.world_size} processes" if parallel.world_size > 1 else f", {torch.get_num_threads()} threads"
    )
    if start >= steps:
        return f"{where}: already trained to step {start} of {steps}, nothing to train"
    if start:
        return f"{where}: steps {start + 1}..{steps} (resumed from step {start})"
    source = exp.config.train.init_from
    return f"{where}: steps 1..{steps}" + (f", starting from the weights of {source}" if source else "")


def _train_loop(
    exp: Experiment,
    optimizer: torch.optim.Optimizer,
    run_dir: Path,
    start: int,
    log: RunLog | None,
    progress: bool,
    parallel: Parallel,
) -> None:
    """Steps start+1..train.steps; rank 0 (the one holding ``log``) writes the log and checkpoints."""
    tr = exp.config.train

    def checkpoint(step: int) -> None:
        # Only finite state is ever saved, so the last checkpoint is always a good one. Every rank
        # checks (their weights are identical), so all stop together; rank 0 writes.
        if not all_finite(exp.modules()):
            raise TrainingDiverged(
                f"non-finite weights after step {step}, not saved; "
                f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}"
            )
        if log is not None and exp.config.eval.checkpoint_samples > 0:
            log.write_eval(step, checkpoint_metrics(exp))
        if parallel.is_main:
            check_run_dir_present(run_dir, step)
            save_checkpoint(
                run_dir,
                step,
                exp.modules(),
                optimizer,
                {"seed": exp.config.run.seed, "schedule": exp.schedule.state_dict()},
                tr.keep_checkpoints,
            )

    if tr.steps == 0 and start == 0:  # an untrained run: its checkpoint is the initialisation
        checkpoint(0)
    if progress and parallel.is_main:
        print(start_line(exp, run_dir, start, parallel), flush=True)
    window: list[dict] = []
    began = time.perf_counter()
    lines = ProgressLines("train", tr.steps, start, enabled=progress and parallel.is_main)
    bar = tqdm(
        range(start + 1, tr.steps + 1),
        initial=start,
        total=tr.steps,
        desc="train",
        disable=None if progress and parallel.is_main else True,
        dynamic_ncols=True,
    )
    last_saved = time.monotonic()
    with stop_on_signals() as stop:
        for step in bar:
            metrics = train_step(exp, optimizer, step, parallel)
            for key in ("loss", "grad_norm"):
                if not math.isfinite(metrics.get(key, 0.0)):
                    raise TrainingDiverged(
                        f"non-finite {key.replace('_', ' ')} {metrics[key]} at step {step}, "
                        f"not applied; last good checkpoint: {latest_checkpoint(run_dir) or 'none'}"
                    )
            window.append(metrics)
            if step % tr.log_every == 0 or step == tr.steps:
                record = {
                    "step": step,
                    **parallel.mean_metrics(_window_mean(window)),
                    "elapsed_s": round(time.perf_counter() - began, 3),
                }
                if log is not None:
                    log.write(record)
                bar.set_postfix(loss=f"{record['loss']:.4f}")
                lines.update(step, f"loss {record['loss']:.4f}")
                window = []
            # every rank stops at the same step (a signal may reach the ranks at different steps)
            stopping = parallel.mean(torch.tensor(float(stop.requested))) > 0
            timed = tr.checkpoint_minutes > 0 and time.monotonic() - last_saved >= 60 * tr.checkpoint_minutes
            if step % tr.checkpoint_every == 0 or step == tr.steps or timed or stopping:
                checkpoint(step)
                last_saved = time.monotonic()
            if stopping and step < tr.steps:
                bar.close()
                where = str(latest_checkpoint(run_dir) or run_dir)
                raise TrainingStopped(stop.signal_name or "a signal to another rank", step, where)
