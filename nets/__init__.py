"""The networks every role that holds weights shares: dense and MoE layers (moe.py), actor and
critics (models.py), the twin critic pass (twin.py), the observation normalizer (normalizer.py,
renorm.py), flat parameter and gradient views (flat.py) and the MoE load-balancing term (balance.py).

The learner computes gradients of these modules, the aggregator keeps their master weights, and
deploy_npu freezes them for export. It imports foundation only.
"""
