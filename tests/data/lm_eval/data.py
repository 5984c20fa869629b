"""The local tasks' datasets: the JSONL file beside this one that a task's ``dataset_kwargs.data_file`` names,
as lm-eval's ``test`` split (read here, nothing fetched from a hub)."""

import json
from pathlib import Path

import datasets


def load(data_file: str, **metadata) -> datasets.DatasetDict:
    lines = (Path(__file__).parent / data_file).read_text(encoding="utf-8").splitlines()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(line) for line in lines if line])})
