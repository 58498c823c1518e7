"""When a request ends: a pure function of the request after a token was appended."""
from __future__ import annotations

from gpu_worker.request import Request


def check_stop(req: Request, token_id: int, stop_string: str | None) -> tuple[str, str | int | None] | None:
    """``(finish_reason, stop_reason)`` if the request ends with ``token_id`` (already its
    last output token; ``stop_string`` is what its detokenizer matched, if anything), else
    None. A stop token, EOS or stop string ends it only once ``min_tokens`` are out; the
    length limit always does. Reads the request, changes nothing."""
    p = req.params
    if req.num_output_tokens >= p.min_tokens:
        if token_id in p.stop_token_ids:
            return "stop", token_id
        if not p.ignore_eos and token_id in req.eos_token_ids:
            return "stop", None
        if stop_string is not None:
            return "stop", stop_string
    if req.num_output_tokens >= req.max_output_tokens:
        return "length", None
    return None
