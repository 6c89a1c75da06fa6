"""The `fleetrl` command line: the only place that parses arguments (`fleet.cli.main:main`).

args.py builds the parser, main.py dispatches a subcommand, fleet_cmds.py holds `fleetrl fleet ...`,
presets.py turns `--task X` into the config a run starts from.
"""
