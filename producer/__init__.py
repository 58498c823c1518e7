"""Client side of the fleet: submit requests to Redis, stream tokens, read results.

Depends on ``shared`` and redis-py only (never on the engine or torch).
"""
from producer.client import AsyncFleetClient, default_redis_url
from producer.errors import FleetError, IdConflict, PayloadTooLarge, RequestFailed
from producer.stream import RequestStream
from producer.sync import FleetClient

__all__ = ["AsyncFleetClient", "FleetClient", "FleetError", "IdConflict", "PayloadTooLarge", "RequestFailed",
           "RequestStream", "default_redis_url"]
