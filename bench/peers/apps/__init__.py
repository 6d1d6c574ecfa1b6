"""The systems' own sides of :mod:`bench.jobs_peers`: each module is imported by that system's worker CLI (its
no-op job) and by :mod:`bench.peers.produce` (its enqueue call), in that system's interpreter."""
