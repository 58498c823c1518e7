"""The gateway's options: served models, API keys, tenant quotas, backpressure bounds."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from shared import keys
from shared import limits as L
from shared.model_names import model_name_of


@dataclass(frozen=True)
class Quota:
    """Per-tenant limits, counted in Redis so every gateway replica shares them.

    requests_per_minute: requests admitted per calendar minute (0: unlimited).
    max_concurrent: requests in flight at once (0: unlimited).
    """

    requests_per_minute: int = 0
    max_concurrent: int = 0


@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    """How one gateway serves.

    models: OpenAI model name -> fleet namespace (a worker's ``--model-name``).
    api_keys: bearer key -> tenant; empty means no authentication (tenant ``default``). A
        tenant must be in the fleet's registry (``fleet tenants add``) and allowed ``lane``,
        else its calls are refused (403): no worker would read its stream.
    quotas: tenant -> :class:`Quota`; tenants not listed get ``default_quota``.
    max_queue: answer 503 when a tenant's stream of the lane holds this many undelivered
        requests (0: no bound); each tenant has its own bound.
    retry_after_s: the ``Retry-After`` of a 503 and of a concurrency 429.
    default_max_tokens: a chat request's max_tokens when it gives none (completions: 16).
    request_timeout_s: each request's fleet deadline, from its arrival.
    lane: the priority lane requests are enqueued into (each tenant's own stream of it).
    tokenizer: directory holding ``tokenizer.json``, to name logprob tokens.
    max_body_bytes: the largest request body read; more is a 413. The fleet refuses a
        payload over ``MAX_PAYLOAD_BYTES`` (its stream entries), so a larger body could
        never be served.
    redis_timeout_s: how long one Redis step of a call (admission, enqueueing, a readiness
        check) may take before the call answers 503.
    log_stats_interval_s: seconds between ``gateway stats`` log lines (0: none).
    """

    redis_url: str
    models: dict[str, str] = field(default_factory=lambda: {"default": "default"})
    api_keys: dict[str, str] = field(default_factory=dict)
    quotas: dict[str, Quota] = field(default_factory=dict)
    default_quota: Quota = Quota()
    max_queue: int = 1000
    retry_after_s: int = 2
    default_max_tokens: int = 256
    request_timeout_s: float = 600.0
    lane: str = "default"
    tokenizer: str | None = None
    max_body_bytes: int = L.MAX_PAYLOAD_BYTES
    redis_timeout_s: float = 5.0
    log_stats_interval_s: float = 10.0

    def __post_init__(self) -> None:
        for namespace in self.models.values():
            keys.check_model(namespace)
        if not self.models:
            raise ValueError("the gateway serves at least one model")

    def quota(self, tenant: str) -> Quota:
        return self.quotas.get(tenant, self.default_quota)


def parse_served_models(specs: list[str], default_namespace: str,
                        model: str | None = None) -> dict[str, str]:
    """``["gpt=default", "smol"]`` -> ``{"gpt": "default", "smol": "smol"}``. Without specs:
    the model's own name (:func:`shared.model_names.model_name_of` of the workers'
    ``--model``, ``SmolLM2-135M-Instruct`` for the embedded default) and the namespace."""
    if not specs:
        return {model_name_of(model): default_namespace, default_namespace: default_namespace}
    models = {}
    for spec in specs:
        name, _, namespace = spec.partition("=")
        models[name] = namespace or name
    return models


def load_keys(path: str | None, env_value: str | None) -> tuple[dict[str, str], dict[str, Quota]]:
    """API keys and per-tenant quotas from a JSON file and/or ``KEY=TENANT,...``."""
    api_keys: dict[str, str] = {}
    quotas: dict[str, Quota] = {}
    if path:
        data = json.loads(Path(path).read_text())
        api_keys.update({str(k): str(t) for k, t in data.get("keys", {}).items()})
        quotas.update({str(t): Quota(**q) for t, q in data.get("quotas", {}).items()})
    for item in (env_value or "").split(","):
        key, sep, tenant = item.strip().partition("=")
        if sep and key:
            api_keys[key] = tenant
    for tenant in api_keys.values():
        keys.request_tag(tenant, "x")  # raises on a tenant name Redis keys cannot hold
    return api_keys, quotas


def options_from_args(args: argparse.Namespace) -> GatewayOptions:
    api_keys, quotas = load_keys(args.api_keys, os.environ.get("FLEET_API_KEYS"))
    return GatewayOptions(
        redis_url=args.redis_url,
        models=parse_served_models(args.served_model, args.model_name, getattr(args, "model", None)),
        api_keys=api_keys, quotas=quotas,
        default_quota=Quota(args.requests_per_minute, args.max_concurrent),
        max_queue=args.max_queue, retry_after_s=args.retry_after,
        default_max_tokens=args.default_max_tokens, request_timeout_s=args.request_timeout,
        lane=args.lane, tokenizer=args.tokenizer, redis_timeout_s=args.redis_timeout,
        log_stats_interval_s=args.log_stats_interval)
