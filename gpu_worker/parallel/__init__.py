"""Pipeline parallelism: the decoder's layers split into stages, one process (and device)
each, with micro-batches in flight so the stages overlap. See :mod:`.pipeline`."""
