"""Launching: every way the roles start as processes and stop again.

The local fleet (local_fleet.py) and its Redis Cluster (local_cluster.py, cluster_admin.py); fleet
specs over several hosts (spec*.py) rendered for Slurm (slurm.py) and Kubernetes (k8s.py); the
watchdog that restarts a dead role (watchdog.py); the run's end (winddown.py); sync mode (sync.py).
It imports the roles' entry points and fleet.report, never fleet.cli or fleet.chaos.
"""
