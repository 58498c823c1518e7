"""An OpenAI-compatible HTTP gateway in front of the fleet (``fleet gateway``).

Importing this package costs nothing: Starlette and uvicorn are imported only when the
server starts (:mod:`producer.gateway.app`), so the rest of the producer runs without them.
"""
from producer.gateway.cli import add_parser

__all__ = ["add_parser"]
