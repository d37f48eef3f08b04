"""crossrt on Ray Serve (``pip install crossrt[ray]``; docs/scale-out.md): a deployment whose
replicas are crossrt runtimes with exclusive pinned cores, KServe v2 on Serve's gRPC and HTTP
proxies, multiplexing, autoscaling on crossrt's in-flight counts, and the Runtime API over a
deployment handle.

Importing this package does not import Ray; its functions do.
"""

from __future__ import annotations

from .app import Scaling, application, deploy, start_serve
from .handle import RayModel
from .replica import Replica, ReplicaConfig

__all__ = [
    "RayModel",
    "Replica",
    "ReplicaConfig",
    "Scaling",
    "application",
    "deploy",
    "start_serve",
]
