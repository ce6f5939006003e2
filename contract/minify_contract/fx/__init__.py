"""The FX program as the capture writes it and the worker reads it: minify's own program format.

A program is a flat `torch.fx.Graph` with small JSON-safe meta (`form`), copied from an
ExportedProgram (`ingest`), its call targets named and resolved from an allowlist (`targets`), and
written as JSON-safe data, no pickle (`wire`). The worker's sandbox children exchange candidates in
this wire form, and a capture whose program `torch.export.save` cannot write saves it as
program.json in the same form (`minify_contract.program_json`, docs/client.md).

The modules here import torch: only the capture (in the user's process) and the worker import them.
Importing this package, or any other module of the contract, does not.
"""
