"""Length-controlled algorithmic tasks (docs/methods.md §2) and their registry."""

from looplab.tasks import (  # noqa: F401  (importing registers the tasks)
    addition,
    copy_task,
    dyck1,
    maze,
    parity,
    reasoning,
    sudoku,
    text,
    tokenized,
    unique_set,
)
from looplab.tasks.base import IGNORE, PAD, QUERY, SEP, START, TASKS, Task, TaskBatch, make_task, register_task

__all__ = ["IGNORE", "PAD", "QUERY", "SEP", "START", "TASKS", "Task", "TaskBatch", "make_task", "register_task"]
