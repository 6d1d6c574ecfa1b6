"""The systems of :mod:`bench.jobs_peers`: one module per system on the benchmark's side (store, worker command,
store check), their job code in :mod:`bench.peers.apps`, and the shared harness pieces."""
