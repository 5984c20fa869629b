"""``looplab serve DIR``: the OpenAI-compatible server (:mod:`looplab.serve`), one process or Ray replicas."""

from __future__ import annotations

import sys

from looplab.errors import LooplabError


def serve_command(args) -> None:
    """Serve a run dir or model dir on ``--host:--port`` until SIGTERM / Ctrl-C (then exit 0)."""
    if args.replicas < 1:
        raise LooplabError(f"--replicas must be ≥ 1, got {args.replicas}")
    if not 0 <= args.port <= 65535:
        raise LooplabError(f"--port must be in 0..65535, got {args.port}")
    options = {"max_running": args.max_running, "max_queue": args.max_queue, "batching": args.batching}
    if args.replicas > 1 or args.ray_address:
        from looplab.serve.replicas import serve_replicas

        serve_replicas(args.model_dir, args.replicas, args.host, args.port, args.ray_address, args.dtype,
                       args.device, **options)  # fmt: skip
        return
    from looplab.generation.text_lm import open_text_lm
    from looplab.serve.app import create_app, model_id
    from looplab.serve.engine import Engine
    from looplab.serve.server import bind, run_app

    lm = open_text_lm(args.model_dir, args.dtype, args.device)
    Engine(lm.model, **options)  # the options' one-line errors before the socket is taken
    app = create_app(lm=lm, **options)
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
