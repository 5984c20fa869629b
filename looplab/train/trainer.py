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

import dataclasses
import json
import math
import time
import tomllib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from looplab.config import Config, from_dict
from looplab.errors import LooplabError
from looplab.io import atomic_write, exclusive_lock
from looplab.model import LoopedTransformer
from looplab.seeding import derive_generator
from looplab.stability.jacobian import jsrr_penalty
from looplab.tasks import Task, make_task
from looplab.train.checkpoint import latest_checkpoint, load_checkpoint, load_weights, save_checkpoint
from looplab.train.distributed import SINGLE, Parallel, data_parallel
from looplab.train.memory import FLOAT, check_fits, parameter_count, training_bytes
from looplab.train.schedules import DepthRule, Schedule, make_schedule

CONFIG_FILE = "config.toml"
LOG_FILE = "log.jsonl"


class TrainingDiverged(LooplabError):
    """The loss, a gradient or the weights became non-finite; the step was not applied or not saved,
    and the last good checkpoint is kept."""

    exit_code = 1


@dataclass
class Experiment:
    """The objects a config describes."""

    config: Config
    task: Task
    model: LoopedTransformer
    schedule: Schedule
    checkpoint: str | None = None

    @staticmethod
    def build(config: Config) -> "Experiment":
        check_device(config.run.device)
        torch.manual_seed(config.run.seed)
        task = make_task(config.task.name, config.task.alphabet)
        check_fits(f"a model of d_model = {config.model.d_model}",
                   FLOAT * parameter_count(config, task.vocab_size), config.run.device,
                   "use a smaller model.d_model or fewer layers")
        model = LoopedTransformer(config.model, task.vocab_size).to(config.run.device)
        schedule = make_schedule(config.schedule, task, config.model.d_model)
        schedule.backprop_loops = config.train.backprop_loops
        if schedule.module is not None:
            schedule.module.to(config.run.device)
        return Experiment(config, task, model, schedule)

    @staticmethod
    def from_run(run_dir: str | Path) -> "Experiment":
        """The experiment of a run directory, with the weights of its latest checkpoint, in eval mode."""
        config = load_run_config(run_dir)
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise LooplabError(f"run dir {run_dir} has no checkpoint yet; train it first")
        exp = Experiment.build(config)
        load_weights(checkpoint, exp.modules())
        if not all_finite(exp.modules()):
            raise LooplabError(f"checkpoint {checkpoint} holds non-finite weights; nothing to evaluate or analyse")
        exp.model.eval()
        exp.checkpoint = checkpoint.name
        return exp

    def modules(self) -> dict[str, torch.nn.Module]:
        """Everything with weights, by checkpoint file name."""
        found = {"model": self.model}
        if self.schedule.module is not None:
            found["schedule"] = self.schedule.module
        return found


def make_optimizer(exp: "Experiment") -> torch.optim.AdamW:
    """AdamW over the model and any learned-schedule module.

    Weight decay applies to matrices only (not norms or biases); a schedule's
    module (the halting head) learns at ``schedule.lr_scale`` × the model's lr.
    """
    config = exp.config
    groups = []
    for name, module in exp.modules().items():
        params = [p for p in module.parameters() if p.requires_grad]
        scale = config.schedule.lr_scale if name == "schedule" else 1.0
        groups += [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.train.weight_decay,
             "lr_scale": scale},
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


def check_device(device: str) -> None:
    """A one-line error when ``run.device`` names a device this machine does not have."""
    if device == "cpu":
        return
    name, _, index = device.partition(":")
    if name != "cuda" or (index and not index.isdigit()):
        raise LooplabError(f"run.device {device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    count = torch.cuda.device_count()
    if int(index or 0) >= count:
        found = f"{count} CUDA device(s), cuda:0..cuda:{count - 1}" if count else "no CUDA device"
        raise LooplabError(f"run.device = {device!r}, but this machine has {found}; valid choices: cpu"
                           + (", cuda[:N]" if count else ""))


def prepare_run_dir(run_dir: Path, config: Config) -> None:
    """Create the run dir, or check that an existing one holds this same config.

    A run dir whose config was written but that holds no checkpoint yet (a start that
    failed before its first step was saved) takes the new config: nothing trained is lost.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    if path.exists() and latest_checkpoint(run_dir) is not None:
        saved = load_run_config(run_dir).to_dict()
        wanted = config.to_dict()
        diff = [f"{s}.{k}" for s in wanted for k in wanted[s] if saved[s][k] != wanted[s][k]]
        if diff:
            raise LooplabError(f"run dir {run_dir} holds a different config (differs in {', '.join(diff[:5])}); "
                               "use a new --out")
        return
    atomic_write(path, lambda tmp: tmp.write_text(config.to_toml()))


def load_run_config(run_dir: Path) -> Config:
    """The resolved config saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise LooplabError(f"run dir not found: {run_dir}")
    if not path.is_file():
        raise LooplabError(f"{run_dir} is not a run dir (no {CONFIG_FILE})")
    try:
        return from_dict(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as err:
        raise LooplabError(f"{path} is not valid TOML: {err}") from None


def read_log(run_dir: Path) -> list[dict]:
    """The records of a run's JSONL log, skipping a torn last line left by a kill mid-write."""
    path = Path(run_dir) / LOG_FILE
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class RunLog:
    """JSONL log plus TensorBoard scalars; on resume, drops entries after the checkpoint."""

    def __init__(self, run_dir: Path, resume_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / LOG_FILE
        kept = [record for record in read_log(run_dir) if record.get("step", 0) <= resume_step]
        atomic_write(self.path, lambda tmp: tmp.write_text("".join(json.dumps(r) + "\n" for r in kept)))
        self.handle = open(self.path, "a")
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def write(self, record: dict) -> None:
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"train/{key}", value, record["step"])

    def close(self) -> None:
        self.handle.close()
        self.tensorboard.close()


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
    batch = parallel.shard(exp.task.sample_lengths(lengths, generator)).to(cfg.run.device)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, cfg) * group["lr_scale"]
    jsrr = cfg.stability.jsrr
    use_jsrr = jsrr.estimator != "none" and step > jsrr.warmup
    if use_jsrr:
        jsrr_generator = derive_generator(cfg.run.seed, "jsrr", step)
        use_jsrr = float(torch.rand((), generator=jsrr_generator)) < jsrr.prob
        jsrr_generator = parallel.fork(jsrr_generator)
    # A rule schedule draws its depths for the global batch and forks the generator itself;
    # a learned one draws as it unrolls this rank's rows only.
    schedule_generator = generator if isinstance(exp.schedule, DepthRule) else parallel.fork(generator)
    with autocast(cfg):
        out = exp.schedule.training_loss(exp.model, batch, schedule_generator, probe=use_jsrr)
    loss, stats = out.loss, out.stats
    if use_jsrr:
        penalty = jsrr_penalty(exp.model, out.probe, jsrr.estimator, jsrr.power_iters, jsrr_generator)
        loss = (1 - jsrr.weight) * loss + jsrr.weight * penalty
        stats = {**stats, "jsrr": float(penalty.detach())}
    global_loss = parallel.mean(loss.detach())  # every rank agrees whether to step
    if not math.isfinite(global_loss):
        return {"loss": global_loss}
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    parallel.average_gradients(exp.modules())
    exp.schedule.load_state_dict(parallel.average_state(exp.schedule.state_dict()))
    # Clipped per module, so the halting head's gradients never rescale the model's.
    norms = {name: float(torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.train.grad_clip))
             for name, module in exp.modules().items()}
    if not all(math.isfinite(norm) for norm in norms.values()):  # a finite loss can still have a NaN gradient
        optimizer.zero_grad(set_to_none=True)
        return {"loss": global_loss, "grad_norm": next(n for n in norms.values() if not math.isfinite(n))}
    optimizer.step()
    return {"loss": global_loss, "lr": optimizer.param_groups[0]["lr"], "grad_norm": norms["model"], **stats}


def all_finite(modules: dict[str, torch.nn.Module]) -> bool:
    """Whether every parameter and buffer of ``modules`` is finite."""
    return all(bool(torch.isfinite(t).all()) for module in modules.values()
               for t in [*module.parameters(), *module.buffers()] if t.is_floating_point())


def _window_mean(window: list[dict]) -> dict:
    """Mean of each metric over the steps that report it (e.g. ``jsrr`` only on regularised steps)."""
    keys = dict.fromkeys(k for metrics in window for k in metrics)
    return {k: sum(m[k] for m in window if k in m) / sum(k in m for m in window) for k in keys}


def train(config: Config, run_dir: str | Path, progress: bool = True) -> Experiment:
    """Train (or resume) the run in ``run_dir``; returns the trained experiment.

    Under torchrun every rank calls this; each returns the same trained weights.
    """
    run_dir = Path(run_dir)
    check_device(config.run.device)  # before anything is written
    check_fits("training", training_bytes(config, make_task(config.task.name, config.task.alphabet)),
               config.run.device, "use a smaller model.d_model, train.batch_size or training depth")
    if config.run.threads > 0:
        torch.set_num_threads(config.run.threads)
    with data_parallel(config) as parallel, ExitStack() as held:
        # Rank 0 locks, creates or checks the run dir while the others wait, so every rank
        # then reads the same latest checkpoint; the lock is held until training ends.
        def claim() -> None:
            held.enter_context(exclusive_lock(run_dir, "run dir"))
            prepare_run_dir(run_dir, config)

        parallel.on_main(claim)
        exp = Experiment.build(dataclasses.replace(config, run=dataclasses.replace(config.run, device=parallel.device)))
        exp.schedule.parallel = parallel
        optimizer = make_optimizer(exp)
        start = 0
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, exp.modules(), optimizer)
            start = state["step"]
            exp.schedule.load_state_dict(state.get("schedule", {}))
        exp.model.train()
        log = RunLog(run_dir, start) if parallel.is_main else None
        try:
            _train_loop(exp, optimizer, run_dir, start, log, progress, parallel)
        finally:
            if log is not None:
                log.close()
        parallel.barrier()  # no rank returns before rank 0's final checkpoint exists
    exp.model.eval()
    return exp


def _train_loop(exp: Experiment, optimizer: torch.optim.Optimizer, run_dir: Path, start: int, log: RunLog | None,
                progress: bool, parallel: Parallel) -> None:
    """Steps start+1..train.steps; rank 0 (the one holding ``log``) writes the log and checkpoints."""
    tr = exp.config.train

    def checkpoint(step: int) -> None:
        # Only finite state is ever saved, so the last checkpoint is always a good one. Every rank
        # checks (their weights are identical), so all stop together; rank 0 writes.
        if not all_finite(exp.modules()):
            raise TrainingDiverged(f"non-finite weights after step {step}, not saved; "
                                   f"last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        if parallel.is_main:
            save_checkpoint(run_dir, step, exp.modules(), optimizer,
                            {"seed": exp.config.run.seed, "schedule": exp.schedule.state_dict()}, tr.keep_checkpoints)

    if tr.steps == 0 and start == 0:  # an untrained run: its checkpoint is the initialisation
        checkpoint(0)
    window: list[dict] = []
    began = time.perf_counter()
    bar = tqdm(range(start + 1, tr.steps + 1), initial=start, total=tr.steps, desc="train",
               disable=None if progress and parallel.is_main else True, dynamic_ncols=True)
    for step in bar:
        metrics = train_step(exp, optimizer, step, parallel)
        for key in ("loss", "grad_norm"):
            if not math.isfinite(metrics.get(key, 0.0)):
                raise TrainingDiverged(f"non-finite {key.replace('_', ' ')} {metrics[key]} at step {step}, "
                                       f"not applied; last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        window.append(metrics)
        if step % tr.log_every == 0 or step == tr.steps:
            record = {"step": step, **parallel.mean_metrics(_window_mean(window)),
                      "elapsed_s": round(time.perf_counter() - began, 3)}
            if log is not None:
                log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
            window = []
        if step % tr.checkpoint_every == 0 or step == tr.steps:
            checkpoint(step)
