"""lm-eval's own ``local-completions`` model — a client looplab did not write — pointed at ``looplab serve`` on
loopback (log-likelihoods through echo + logprobs on /v1/completions, the model dir's own tokenizer on the
client's side) gives the log-likelihoods and greedy flags of ``--model looplab`` on a local task; the
tokenizer routes answer as vLLM's do."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from looplab.cli import main  # noqa: E402
from looplab.generation.text_lm import open_text_lm  # noqa: E402
from looplab.harness import register  # noqa: E402
from tests.integration.test_harness import TASKS  # noqa: E402
from tests.integration.test_serve import serving  # noqa: E402
from tests.lm_dirs import save_model_dir  # noqa: E402

register()


def _loglikelihoods(model, model_args: str | None = None) -> list[list[tuple[float, bool]]]:
    """Per document of the local multiple-choice task, (log-likelihood, is greedy) of each choice."""
    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    samples = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=["looplab_choice"], task_manager=tasks, log_samples=True,
        verbosity="ERROR",
    )["samples"]["looplab_choice"]  # fmt: skip
    ordered = sorted(samples, key=lambda sample: sample["doc_id"])
    return [[(float(resp[0][0]), bool(resp[0][1])) for resp in sample["resps"]] for sample in ordered]


@pytest.fixture(scope="module")
def retrofit(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    save_model_dir("llama", root / "llama")
    command = f"retrofit {root / 'llama'} --prelude 1 --core 2 --coda 1 --injection mix --out {root / 'rf'}"
    assert main(command.split()) == 0
    return root / "rf"


def test_lm_evals_local_completions_through_the_server_gives_looplabs_loglikelihoods(retrofit):
    direct = _loglikelihoods(
        get_model("looplab").create_from_arg_string(f"path={retrofit},prefix_token=0,dtype=float32")
    )
    with serving(open_text_lm(retrofit)) as (url, engine):
        args = (
            f"base_url={url}/v1/completions,model={retrofit.name},tokenizer_backend=huggingface,"
            f"tokenizer={retrofit},tokenized_requests=True,add_bos_token=True,custom_prefix_token_id=0"
        )
        served = _loglikelihoods("local-completions", args)
        assert engine.stats["submitted"] >= sum(map(len, direct))  # the server answered them
    assert len(served) == len(direct) > 0
    for ours, theirs in zip(served, direct, strict=True):
        assert [greedy for _, greedy in ours] == [greedy for _, greedy in theirs]
        assert [loglik for loglik, _ in ours] == pytest.approx([loglik for loglik, _ in theirs], abs=1e-5)


def test_the_tokenizer_routes_answer_as_vllms(retrofit):
    lm = open_text_lm(retrofit)
    with serving(lm) as (url, _):
        info = httpx.get(f"{url}/tokenizer_info").json()
        assert set(info) >= {"eos_token", "bos_token", "pad_token", "model_max_length"}
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": "In the beginning", "add_special_tokens": False}).json()
        assert tokens["tokens"] == lm.encode("In the beginning", prompt=False) and tokens["count"] == len(
            tokens["tokens"]
        )
        text = httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}).json()
        assert text == {"prompt": lm.decode(tokens["tokens"])}
        for route, body, field in [
            ("tokenize", {"prompt": 3}, "prompt"),
            ("tokenize", {"prompt": "\ud800"}, "prompt"),
            ("tokenize", {"text": "x"}, "text"),
            ("tokenize", [1], "body"),
            ("detokenize", {"tokens": [lm.vocab_size]}, "tokens"),
            ("detokenize", {"tokens": "abc"}, "tokens"),
        ]:
            refused = httpx.post(f"{url}/{route}", content=json.dumps(body))  # ASCII: a lone surrogate as \\ud800
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field, (route, body)
        assert httpx.post(f"{url}/tokenize", content=b"{").status_code == 400
        deep = httpx.post(f"{url}/tokenize", content=b"[" * 100_000)
        assert (
            deep.status_code == 400 and "nested too deeply to be a tokenizer request" in deep.json()["error"]["message"]
        )


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    from looplab.config import load_config
    from looplab.train.trainer import train
    from tests.integration.test_stars_lm import TINY

    run_dir = tmp_path_factory.mktemp("served_bytes") / "lm"
    train(load_config(None, TINY), run_dir, progress=False)
    return run_dir


def test_a_byte_lm_scores_rolling_text_through_lm_evals_remote_tokenizer(byte_run):
    """The server names the byte LM's start token, so lm-eval's ``local-completions`` with the server's own
    tokenizer (``tokenizer_backend=remote``) scores ``loglikelihood_rolling`` as ``--model looplab`` does."""
    from lm_eval.api.instance import Instance

    from looplab.tasks.base import START

    texts = ["In the beginning God created", "And the earth was without form"]
    requests = [Instance("loglikelihood_rolling", {}, (text,), index) for index, text in enumerate(texts)]
    direct = get_model("looplab").create_from_arg_string(f"path={byte_run}").loglikelihood_rolling(requests)
    lm = open_text_lm(byte_run)
    with serving(lm) as (url, _):
        info = httpx.get(f"{url}/tokenizer_info").json()
        assert info["bos_token"] == "<s>" and info["eos_token"] is None
        start = httpx.post(f"{url}/tokenize", json={"prompt": "<s>", "add_special_tokens": False}).json()
        assert start["tokens"] == [START]
        args = f"base_url={url}/v1/completions,model=lm,tokenizer_backend=remote,tokenized_requests=True"
        served = get_model("local-completions").create_from_arg_string(args).loglikelihood_rolling(requests)
    assert served == pytest.approx(direct, abs=1e-5)
