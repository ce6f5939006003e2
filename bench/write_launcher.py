"""Child process: write the script torch writes for a failing compile, for one .pt2.

    python bench/write_launcher.py PROGRAM.pt2 [--config JSON] [--device cpu]

When a compile fails under `torch._dynamo.config.repro_after = "aot"` and `repro_level = 2`,
after_aot's `debug_wrapper` calls `dump_to_minify(gm, args, compiler_name)`, which writes
`torch_compile_debug/run_*/minifier/minifier_launcher.py` under the current directory (the graph
after AOT autograd as a module, its inputs saved beside it in `checkpoints/`, inductor's whole
config) and prints its path. A user then runs `python minifier_launcher.py`: `minify`, isolated
by default (a fresh Python per check). We call the same `dump_to_minify` on the graph the other
minifiers start from (bench/torch_side.py: the program's flat graph, parameters and buffers as
inputs) after setting the case's inductor config, and print the launcher's path. Run it with the
working directory set to the run's scratch folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from common import DEFAULT_CONFIG, apply_inductor_config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("program", type=Path)
    parser.add_argument("--config", default=json.dumps(DEFAULT_CONFIG), help="inductor config, JSON")
    parser.add_argument("--device", default="cpu", help="where the program lives (it was exported there)")
    options = parser.parse_args(argv)

    import torch
    from torch._dynamo.repro.after_aot import dump_to_minify
    from torch_side import flat_inputs

    apply_inductor_config(json.loads(options.config))  # the launcher embeds inductor's config as it is now
    program = torch.export.load(options.program)
    inputs = [value.to(options.device) if isinstance(value, torch.Tensor) else value for value in flat_inputs(program)]
    dump_to_minify(program.graph_module, inputs, "inductor")
    # Its folder is named after the time of the call (`get_debug_dir`): find the file it wrote.
    written = sorted(Path.cwd().glob("torch_compile_debug/run_*/minifier/minifier_launcher.py"))
    if not written:
        raise SystemExit("dump_to_minify wrote no minifier_launcher.py")
    print(written[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
