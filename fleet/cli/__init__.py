"""The `fleetrl` command line: the only place that parses arguments (`fleet.cli.main:main`).

args.py builds the parser (help.py: what every help page shares; export_args.py: `export`'s
arguments, without deploy_npu), main.py dispatches a subcommand by its HANDLERS table,
commands.py holds the handlers, resolve.py turns a command line into a config, task names and a
run directory (checked at the door), fleet_cmds.py holds `fleetrl fleet ...`, presets.py turns
`--task X` into the config a run starts from.
"""
