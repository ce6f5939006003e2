"""The contract between minify's client, server and worker: what each of them must read the same way.

- `models`: the wire models (JobSpec, Report, ProgressEvent, ...), the HTTP API's and report.json's.
- `signatures`: how an exception becomes a failure signature (root cause, normalized key).
- `accuracy`: when a compiled graph's outputs count as wrong (repro.py carries it verbatim).
- `zero_tensors`: how inputs.pt and values.pt hold a ZeroTensor, which torch.save refuses (a marker).
- `summaries`: how a report reads in one line (the CLIs, the events, repro.py's header).
- `bugs`: the key that files jobs under one compiler bug.
- `archive`: which members of a .pt2 would run code when loaded (pure Python).
- `config_keys`, `config_schema`, `specflags`: JobSpec.config keys and what a torch accepts, the spec flags.
- `ledger`, `queue`: a job's Redis record, ticket and events, and the RQ queues and entries
  (need `redis` and `rq`: the server and the worker import them, the client never does).

Torch-free, and, but for `ledger` and `queue`, free of everything the client does not install.
"""
