"""The Redis edge of a worker: intake, leases, fencing, progress, results, drain."""
