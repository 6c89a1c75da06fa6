"""fleetrl: asynchronous actor-learner fleet for MuJoCo manipulation, with NPU export."""

__version__ = "0.1.0"
