"""The top layer of fleetrl: everything that starts, wires and supervises the roles as processes.

Four rooms, each importing only the rooms below it (import-linter checks it):

    fleet.chaos   fault injection, network faults, the soak and its audit (no production path imports it)
    fleet.cli     the `fleetrl` command line: argument parsing, the subcommand table, presets
    fleet.launch  the local fleet, Redis Cluster, fleet specs, Slurm, Kubernetes, watchdog, wind-down, sync mode
    fleet.report  live progress, the run's summary, provenance (code.json) and the HTML report

Nothing below this package imports it.
"""
