"""The ``looplab generate`` subcommand's arguments: prompts, sampling, and the exit, cache and decoder with
their parameters (the flags :mod:`looplab.generation.fields` parses, with their earlier, shorter spellings)."""

from __future__ import annotations

import argparse

from looplab.generation import DECODERS, EXITS, MAX_LOOPS, POLICIES

#: the help of ``--weights`` (generate, serve, eval on a model dir)
WEIGHTS_HELP = "a model dir's linear layers: float (default, in --dtype) or int8, its quality cost printed"
#: the help of ``--dtype`` (every command on a model dir; :func:`looplab.lm.dtypes.default_dtype`)
DTYPE_HELP = (
    "a model dir's weights: float32 or bfloat16 (default: bfloat16 on a CPU with native bfloat16 arithmetic "
    "(AVX512-BF16, AMX), else float32)"
)
#: the help of ``--tokenizer`` (every command on a model dir)
TOKENIZER_HELP = "a model dir whose tokenizer is kept elsewhere (Parcae's): the folder holding tokenizer.json"


def add_generate(commands: argparse._SubParsersAction) -> None:
    """Add ``generate`` to the ``looplab`` subcommands."""
    generate = commands.add_parser(
        "generate",
        help="continue text prompts with a trained byte-level LM run (kjv, kjv_arithmetic, kjv_trace) or a model dir "
        "(a native looped LM or a retrofit, its own tokenizer), depth per token",
    )
    generate.add_argument(
        "run_dir", metavar="DIR", help="a trained run of a text task, or a model dir (config.json: native or retrofit)"
    )
    generate.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    generate.add_argument("--prompts-file", help="a UTF-8 file of prompts, one per line")
    generate.add_argument("--max-new-tokens", type=int, default=64, help="tokens to add per prompt (default 64)")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 (the default) decodes greedily")
    generate.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (0: all)")
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    generate.add_argument(
        "--exit",
        default="fixed",
        metavar="NAME",
        help=f"how deep each new token runs: {', '.join(EXITS)} or a plugin's (default: fixed)",
    )
    generate.add_argument(
        "--loops",
        type=int,
        help=f"the fixed depth, or the cap of an adaptive exit, 1..{MAX_LOOPS} (default: a run's "
        "eval.exits.fixed.depth, a model dir's native loop count)",
    )
    generate.add_argument(
        "--exit-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the chosen exit, e.g. eps=0.01 (repeatable; default: the run's [generate.exits.NAME])",
    )
    generate.add_argument("--eps", type=float, help="the earlier spelling of --exit-param eps=E (convergence, kl)")
    generate.add_argument("--threshold", type=float, help="the earlier spelling of --exit-param threshold=P")
    generate.add_argument(
        "--cache",
        metavar="NAME",
        help=f"KV cache across loops: {', '.join(POLICIES)}, a plugin's, or none (recompute every step; "
        "default per_loop)",
    )
    generate.add_argument(
        "--cache-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the chosen cache, e.g. keep_loops=3 for last_m (repeatable)",
    )
    generate.add_argument("--keep-loops", type=int, help="the shorter spelling of --cache-param keep_loops=M (last_m)")
    generate.add_argument("--stop", action="append", default=[], help="stop a row at this text (\\n for a newline)")
    generate.add_argument("--show-depths", action="store_true", help="print the loops of every new token")
    generate.add_argument(
        "--decoder",
        metavar="NAME",
        help=f"how the tokens run: {', '.join(DECODERS)} or a plugin's (default step; docs/generation.md); step: "
        "a step's tokens run together; depth: each core call advances every row by one loop of its own token; "
        "wavefront: also many positions of a row at once, each a guess checked by greedy decoding; speculative: "
        "draft at fewer loops, verify at --loops",
    )
    generate.add_argument(
        "--decoder-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the chosen decoder, e.g. max_batch=8 for depth (repeatable)",
    )
    generate.add_argument(
        "--batching", metavar="NAME", help="the earlier spelling of --decoder (step, depth, wavefront)"
    )
    generate.add_argument(
        "--read-only-exit",
        action="store_true",
        help="step decoder: run every token to --loops and only read it at its exit's loop (Ouro's own forward; "
        "saves no compute); default: a token that exits stops computing",
    )
    generate.add_argument(
        "--draft-loops",
        type=int,
        metavar="k",
        help="--decoder speculative with draft_loops=k: draft at k loops, verify at --loops (fixed exit, per_loop "
        "cache; greedy)",
    )
    generate.add_argument("--draft-tokens", type=int, metavar="n", help="speculative: tokens drafted per round (4)")
    generate.add_argument("--max-batch", type=int, metavar="N", help="depth: decode N prompts at once (0: all)")
    generate.add_argument("--front", type=int, metavar="N", help="wavefront: positions of a row in flight (0: loops)")
    generate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per prompt (prompt, prompt_ids, token_ids, text, loops, logprobs) on stdout, "
        "the summary line on stderr",
    )
    generate.add_argument("--dtype", help=DTYPE_HELP)
    generate.add_argument("--weights", help=WEIGHTS_HELP)
    generate.add_argument("--tokenizer", metavar="DIR", help=TOKENIZER_HELP)
    generate.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a plugin (a module name or a .py path) before decoding: its exits, caches and decoders; a run "
        "dir's [run] plugins are imported anyway (repeatable)",
    )
