"""Fault injection for engine tests: a model step that raises on the batches you choose."""


def poison_forward(engine, when) -> None:
    """Make ``engine``'s model step raise whenever ``when(scheduled request ids)`` is true."""
    execute = engine.runner.execute

    def maybe_raise(sched_out):
        if when([s.request.request_id for s in sched_out.scheduled]):
            raise RuntimeError("forward exploded")
        return execute(sched_out)

    engine.runner.execute = maybe_raise
