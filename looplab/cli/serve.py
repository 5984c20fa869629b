"""``looplab serve DIR``: the OpenAI-compatible server (:mod:`looplab.serve`), one process or Ray replicas."""

from __future__ import annotations

import sys

from looplab.errors import LooplabError


def kv_line(lm, max_running: int, ledger) -> str:
    """What the KV cache of one request takes at the model's default loops (per_loop), per 1K tokens, and of
    ``max_running`` such requests, against the engine's KV memory (``ledger``); a limit that holds no request at
    all is refused."""
    from looplab.generation.budget import generation_bytes
    from looplab.generation.views import decodable
    from looplab.memory import GIB

    loops, view = lm.default_loops, decodable(lm.model)
    smallest = generation_bytes(view, 1, 1, 1, loops, "per_loop")
    if smallest > ledger.limit:
        raise LooplabError(
            f"--kv-memory {ledger.describe()} holds no request: one prompt token and one new token at {loops} loops "
            f"need {smallest / 2**20:,.2f} MiB"
        )
    per_1k = generation_bytes(view, 1, 0, 1024, loops, "per_loop")
    return (
        f"a request's KV cache at {loops} loops (per_loop) takes {per_1k / 2**20:,.0f} MiB per 1K tokens; "
        f"--max-running {max_running} such requests {max_running * per_1k / GIB:,.2f} GiB, "
        f"the KV memory {ledger.describe()}"
    )


def serve_command(args) -> None:
    """Serve a run dir or model dir on ``--host:--port`` until SIGTERM / Ctrl-C (then exit 0)."""
    if args.replicas < 1:
        raise LooplabError(f"--replicas must be ≥ 1, got {args.replicas}")
    if not 0 <= args.port <= 65535:
        raise LooplabError(f"--port must be in 0..65535, got {args.port}")
    if args.max_queue < 1:
        raise LooplabError(f"--max-queue must be ≥ 1 (a queue of 0 refuses every request), got {args.max_queue}")
    if args.max_token_loops < 1:
        raise LooplabError(f"--max-token-loops must be ≥ 1, got {args.max_token_loops}")
    if args.kv_memory is not None and not args.kv_memory > 0:  # NaN too
        raise LooplabError(f"--kv-memory must be a positive number of GiB, got {args.kv_memory}")
    if args.prefix_cache is not None and not args.prefix_cache >= 0:
        raise LooplabError(f"--prefix-cache must be a number of GiB ≥ 0 (0: off), got {args.prefix_cache}")
    from looplab.cli.models import refuse_model_dir_flags
    from looplab.experiment import check_device
    from looplab.lm.dtypes import default_dtype
    from looplab.lm.int8 import check_weights

    check_weights(args.weights or "float", args.device)  # before the device: int8 is for the CPU alone
    try:
        check_device(args.device)
    except LooplabError as err:
        raise LooplabError(str(err).replace("run.device", "--device")) from None
    refuse_model_dir_flags(args.model_dir, args, "served")
    if args.weights == "int8" and (args.replicas > 1 or args.ray_address):
        raise LooplabError("--weights int8 serves one process; drop --replicas / --ray-address")
    dtype = args.dtype or default_dtype(args.device, args.weights or "float")
    options = {"max_running": args.max_running, "max_queue": args.max_queue, "batching": args.batching}
    if args.kv_memory is not None:
        options["kv_memory"] = round(args.kv_memory * 2**30)
    if args.prefix_cache is not None:
        options["prefix_memory"] = round(args.prefix_cache * 2**30)
    if args.dense_kv:
        options["paged"] = False
    if args.replicas > 1 or args.ray_address:
        from looplab.serve.replicas import serve_replicas

        serve_replicas(args.model_dir, args.replicas, args.host, args.port, args.ray_address, dtype,
                       args.device, args.tokenizer, **options)  # fmt: skip
        return
    from looplab.generation.text_lm import open_text_lm
    from looplab.serve.app import create_app, model_id
    from looplab.serve.engine import Engine
    from looplab.serve.server import bind, run_app

    def say(line: str) -> None:
        print(f"serve: {line}", file=sys.stderr, flush=True)

    lm = open_text_lm(
        args.model_dir, dtype, args.device, args.weights or "float", announce=say, tokenizer=args.tokenizer
    )
    if lm.weights_note:
        say(lm.weights_note)
    engine = Engine(lm.model, **options)  # the options' one-line errors before the socket is taken
    say(kv_line(lm, args.max_running, engine.ledger))
    app = create_app(lm=lm, max_token_loops=args.max_token_loops, **options)
    try:
        sock = bind(args.host, args.port)
    except OSError as err:
        raise LooplabError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    host, port = sock.getsockname()[:2]
    print(
        f"looplab serve: {model_id(lm)} on http://{host}:{port}/v1 (SIGTERM or Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    run_app(app, sock)
