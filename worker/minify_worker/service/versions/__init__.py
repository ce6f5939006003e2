"""The version phase: which torch versions have the bug (issue 34).

After a job's result is delivered, its `repro.py` runs under every other torch installation the
workers offer, and the runs say which versions fail the same way, the regression range and the
version that fixed it.

- `ranges`: torch versions ordered, one run classified, the range, the fix, the summary line (pure).
- `envs`: the torch installations a worker offers (its own, MINIFY_TORCH_ENVS, MINIFY_TORCH_INDEX).
- `probe`: one run of repro.py under one interpreter, in its own process group, with a timeout.
- `phase`: the fan-out through RQ (a queue per version), the collection, the rewritten artifacts.
"""
