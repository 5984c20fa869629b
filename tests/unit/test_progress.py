"""Progress off a terminal (lines with an ETA) and the sweep bar that moves while runs train."""

import io
import json
import time

from tqdm import tqdm

from looplab import progress
from looplab.progress import ProgressLines, duration
from looplab.sweep.run_point import PointJob
from looplab.sweep.runner import StepWatcher


def test_duration_reads_like_a_person_would_say_it():
    assert [duration(s) for s in (0, 42, 125, 3725)] == ["0 s", "42 s", "2 min 05 s", "1 h 02 min"]


def test_lines_off_a_terminal_say_how_far_and_how_long(monkeypatch, capsys):
    monkeypatch.setattr(progress, "is_terminal", lambda: False)
    lines = ProgressLines("train", 100, start=20, every_s=0.0)
    lines.began -= 10  # ten seconds in: 30 of the 80 steps left to do here were done
    lines.update(50, "loss 0.5000")
    lines.update(100, "loss 0.1000")
    first, last = capsys.readouterr().out.splitlines()
    assert first.startswith("train: 50/100 (50%), loss 0.5000, elapsed 10 s, ETA 17 s")
    assert last.startswith("train: 100/100 (100%), loss 0.1000") and "ETA" not in last


def test_lines_are_silent_on_a_terminal_and_rate_limited(monkeypatch, capsys):
    monkeypatch.setattr(progress, "is_terminal", lambda: True)
    ProgressLines("train", 10).update(10)
    monkeypatch.setattr(progress, "is_terminal", lambda: False)
    limited = ProgressLines("train", 10, every_s=3600)
    for step in range(1, 10):
        limited.update(step)
    assert capsys.readouterr().out == ""


def test_sweep_bar_moves_with_the_training_steps_of_running_runs(tmp_path):
    jobs = []
    for name, logged in (("a", [10, 20]), ("b", [5]), ("c", [])):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "log.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in logged))
        jobs.append(PointJob(str(run_dir), "[train]\nsteps = 40\n"))
    bar = tqdm(total=3, file=io.StringIO())
    watcher = StepWatcher(jobs, bar, every_s=0.02)
    time.sleep(0.2)
    watcher.stop()
    assert bar.postfix == "training steps 25/120"


def test_progress_off_a_terminal_prints_counted_lines_with_the_detail(monkeypatch, capsys):
    monkeypatch.setattr(progress, "is_terminal", lambda: False)
    with progress.Progress("spectral", 3, unit="loop", every_s=0.0) as bar:
        for t in (1, 2, 3):
            bar.advance(detail=f"loop {t}")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "spectral: 1/3 (33%)",
        "spectral: 2/3 (67%)",
        "spectral: 3/3 (100%)",
    ]
    assert "loop 2" in lines[1] and "ETA" in lines[1] and "ETA" not in lines[2]


def test_progress_disabled_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "is_terminal", lambda: False)
    with progress.Progress("eval", 2, enabled=False) as bar:
        bar.advance()
        bar.advance()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
