"""``fleet``: the front door. Producer commands here; ``worker``/``quantize``/``bench`` go to gpu_worker.

The engine side is imported only when asked for, so the producer runs without torch.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from producer.client import AsyncFleetClient, default_redis_url
from producer.errors import RequestFailed
from shared import cliargs

ENGINE_COMMANDS = frozenset({"worker", "quantize", "bench"})  # mirrors gpu_worker.cli.ENGINE_COMMANDS


def _engine_commands() -> frozenset[str]:
    try:
        import gpu_worker.cli as engine_cli
    except ImportError:
        return ENGINE_COMMANDS
    return engine_cli.ENGINE_COMMANDS


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=default_redis_url(),
                        help="redis:// or rediss:// URL; ACL user as user:password@ "
                             "(default: $REDIS_URL, else redis://127.0.0.1:6379/0)")
    parser.add_argument("--model-name", default="default", help="stream namespace")


def build_parser() -> argparse.ArgumentParser:
    from producer import batch, dead, demo, exporter, gateway, status, tenants_cli

    parser = cliargs.Parser(prog="fleet", description="LLM inference fleet fed by Redis")
    cliargs.add_version(parser)  # the installed package's version
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="submit one prompt and stream the answer")
    add_common(p)
    p.add_argument("prompt", help="the user message (or raw prompt with --raw)")
    p.add_argument("--raw", action="store_true", help="send as a raw prompt, not a chat")
    p.add_argument("--system", default=None, help="system message for the chat")
    p.add_argument("--max-tokens", type=int, default=128, help="the most tokens generated")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    p.add_argument("--lane", choices=("high", "default", "batch"), default="default",
                   help="priority lane")
    p.add_argument("--request-id", default=None, help="idempotency key (default: a new id)")
    p.add_argument("--tenant", default="default", help="the tenant's own stream")
    p.add_argument("--timeout", type=float, default=None, help="deadline, seconds from now")
    p.set_defaults(_run=run_submit)
    for module in (batch, status, dead, demo, gateway, exporter, tenants_cli):
        module.add_parser(sub, add_common)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("worker", help="run a worker (engine side)")
    sub.add_parser("quantize", help="quantize a model once, into the cache (engine side)")
    sub.add_parser("bench", help="benchmarks (engine side)")
    return parser


def chat_fields(args: argparse.Namespace) -> dict:
    if args.raw:
        return {"prompt": args.prompt}
    messages = [{"role": "system", "content": args.system}] if args.system else []
    return {"messages": messages + [{"role": "user", "content": args.prompt}]}


async def _submit(args: argparse.Namespace) -> int:
    import time

    fields = chat_fields(args)
    fields.update(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                  priority=args.lane, tenant=args.tenant)
    if args.request_id:
        fields["request_id"] = args.request_id
    if args.timeout:
        fields["deadline"] = time.time() + args.timeout
    async with AsyncFleetClient(args.redis_url, model=args.model_name, tenant=args.tenant) as fleet:
        stream = await fleet.submit(**fields)
        async for token in stream:
            sys.stdout.write(token.text)
            sys.stdout.flush()
        try:
            result = await stream.result()
        except RequestFailed as exc:
            sys.stderr.write(f"\nfailed: {exc}\n")
            return 2
    sys.stdout.write("\n")
    sys.stderr.write(f"[{result.finish_reason}, {result.usage.completion_tokens} tokens, "
                     f"{result.timings.total_s:.2f}s]\n")
    return 0


def run_submit(args: argparse.Namespace) -> int:
    return asyncio.run(_submit(args))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _engine_commands():
        import gpu_worker.cli as engine_cli

        return int(engine_cli.main(argv) or 0)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
