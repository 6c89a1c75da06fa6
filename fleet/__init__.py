"""The top layer of fleetrl: everything that starts, wires and supervises the roles as processes.

CLI (`fleetrl ...`), the local launcher, fleet specs over several hosts, the watchdog, the local
Redis Cluster, sync mode, progress, report and presets. Nothing below imports this package.
"""
