"""Reporting: live progress, the run's summary.json, code.json provenance and the HTML report.

It reads the files a run writes and the fleet's metrics; it starts nothing and imports no other room.
"""
