"""Load tools (`ocrvl bench sweep`), kept outside the gateway's import graph.

Only `app.cli` imports `app.bench.commands` (argparse only); everything else here, with Pillow
and matplotlib from the `bench` extra, loads when the command runs. A gateway image, installed
without the extra, never loads them.

Modules: `commands` (the command line), `corpus` (synthetic or user pages), `load` (the closed
loop), `engine` (vLLM's /metrics during a level), `stats` (a level's numbers), `report` (JSON,
markdown, machine), `plot` (the PNG), `progress` (the terminal bar), `sweep` (levels, compare,
early stop).
"""
