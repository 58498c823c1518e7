"""``fleet gateway``: arguments, and the server start (uvicorn on uvloop)."""
from __future__ import annotations

import argparse
import logging
import os

from shared import logs

logger = logging.getLogger(__name__)


def add_parser(sub, add_common) -> None:
    p = sub.add_parser("gateway", help="serve the OpenAI API (completions, chat) over the fleet")
    add_common(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (also serves /metrics)")
    p.add_argument("--served-model", action="append", default=[], metavar="NAME[=NAMESPACE]",
                   help="a model name clients may ask for, and the fleet namespace (a worker's "
                        "--model-name) it goes to; repeatable (default: the model's own name, "
                        "see --model, and --model-name itself)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="the workers' --model, only to name it (its folder or .gguf file name; "
                        "default: the embedded SmolLM2-135M-Instruct); never loaded here")
    p.add_argument("--api-keys", default=os.environ.get("FLEET_API_KEYS_FILE"), metavar="FILE",
                   help="JSON {'keys': {KEY: TENANT}, 'quotas': {TENANT: {...}}}; keys may also "
                        "come from $FLEET_API_KEYS as KEY=TENANT,... (none: no auth, tenant "
                        "'default'); each TENANT must be registered (fleet tenants add)")
    p.add_argument("--max-queue", type=int, default=1000,
                   help="answer 503 when this many requests of the caller's tenant wait "
                        "undelivered in its lane stream (0: no bound)")
    p.add_argument("--requests-per-minute", type=int, default=0,
                   help="per-tenant request quota, shared by all replicas through Redis (0: none)")
    p.add_argument("--max-concurrent", type=int, default=0,
                   help="per-tenant requests in flight, shared through Redis (0: none)")
    p.add_argument("--retry-after", type=int, default=2,
                   help="seconds a 503 (or concurrency 429) asks the client to wait")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens of a chat request that gives none")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds until a request's fleet deadline")
    p.add_argument("--redis-timeout", type=float, default=5.0,
                   help="seconds one Redis step of a call may take before it answers 503")
    p.add_argument("--lane", choices=("high", "default", "batch"), default="default",
                   help="the lane requests are enqueued into")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="directory with tokenizer.json, to name logprob tokens (default: "
                        "'token_id:N' names)")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between 'gateway stats' log lines (0: none)")
    logs.add_arguments(p)
    p.set_defaults(_run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from producer.gateway.app import create_app
    from producer.gateway.options import options_from_args
    from producer.gateway.redact import install_log_redaction

    install_log_redaction()  # before uvicorn or redis-py log anything: URLs hold passwords
    logs.configure_from(args)  # uvicorn's loggers propagate here (log_config=None below)
    app = create_app(options_from_args(args))
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:  # uvloop is optional on platforms without it
        loop = "asyncio"
    uvicorn.run(app, host=args.host, port=args.port, loop=loop, log_level=args.log_level,
                log_config=None, timeout_graceful_shutdown=30)
    return 0
