"""The bottom layer of fleetrl: the contracts every role shares, importing no role.

Config, wire format, protos, policy spec and numpy actor, acting, transport (channels,
security, `connect`), shared memory, process helpers, ledger, checkpoint format, errors, the
role shape (role.py), TensorBoard writer, metrics. The roles (sim/, buffer/, learner/,
aggregator/, sampler/, deploy_npu/) build on it; fleet/ assembles them.
"""

__version__ = "0.1.0"
