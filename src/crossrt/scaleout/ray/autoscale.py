"""Autoscaling on crossrt's own count of requests in flight.

Each replica reports ``crossrt_in_flight`` (:meth:`Replica.record_autoscaling_stats`: the
requests its models hold, queued or running, as their statistics count them); this policy
asks for enough replicas that each holds ``target`` of them. Serve applies its
``autoscaling_config`` around it (min and max replicas, upscale and downscale delays).
Serve pickles this module by value into its controller: it imports nothing of crossrt.
"""

from __future__ import annotations

import math
from typing import Any

METRIC = "crossrt_in_flight"
POLICY = "crossrt.scaleout.ray.autoscale:InFlightPolicy"
"""``autoscaling_config["policy"]["policy_function"]`` for this policy (``policy_kwargs``:
``{"target": N}``)."""


class InFlightPolicy:
    """Serve's custom autoscaling policy: ``ceil(in flight over every replica / target)``
    replicas, within the bounds Serve allows; before any replica has reported, Serve's own
    count of ongoing requests stands in.

    Args:
        target: requests in flight one replica should hold.
    """

    def __init__(self, target: float = 2.0) -> None:
        if not target > 0:
            raise ValueError(f"target={target!r}: give requests in flight per replica, > 0")
        self.target = float(target)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        try:
            reported = ctx.aggregated_metrics.get(METRIC) or {}
        except Exception:  # no custom metrics yet (the replicas are starting)
            reported = {}
        total = sum(reported.values()) if reported else float(ctx.total_num_requests or 0)
        lowest, highest = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        wanted = math.ceil(total / self.target) if total > 0 else lowest
        return max(lowest, min(highest, wanted)), {}
