"""The fleet's wire protocol: message types, key names and limits. Depends on msgspec only."""
from shared.protocol import (
    Cancel,
    ChatMessage,
    Event,
    Failure,
    Request,
    Result,
    Timings,
    Token,
    TokenLogprob,
    Usage,
)

__all__ = [
    "Cancel", "ChatMessage", "Event", "Failure", "Request", "Result", "Timings", "Token", "TokenLogprob",
    "Usage",
]
