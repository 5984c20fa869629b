"""The scripting walk-through (looplab/examples/scripting.py, shown in docs/scripting.md) runs and its numbers agree."""

import pytest
import torch

from looplab.examples.scripting import main


def test_scripting_walk_through(tmp_path, capsys):
    torch.set_num_threads(1)
    found = main(tmp_path, steps=10)
    assert found["policy_ood_samples"] == pytest.approx(found["policy_ood_summary"], abs=1e-12)
    rows = torch.arange(len(found["depth"]))
    assert int(found["depth"].min()) >= 1 and int(found["depth"].max()) <= 12
    assert torch.allclose(found["log_pi"].exp().sum(1), torch.ones(4))
    assert torch.allclose(found["log_prob"], found["log_pi"][rows, found["depth"] - 1], atol=1e-5)
    assert found["penalty"].shape == (4,) and bool((found["penalty"] >= 0).all())
    assert "loop03.core1.resid" in found["trace_names"]
    printed = capsys.readouterr().out
    assert "input:  <s>" in printed and "answer:" in printed and "model:" in printed


def test_the_scripting_page_shows_the_example_as_it_is():
    from pathlib import Path

    import looplab.examples.scripting as example

    source = Path(example.__file__).read_text()
    body = source[source.index("def main(") : source.index('\n\nif __name__ == "__main__":')]
    page = Path(__file__).resolve().parents[2] / "docs" / "scripting.md"
    assert body in page.read_text()
