"""The KServe v2 protocol modules under the names their classes carry, and the servicer
function Serve's gRPC proxy adds (``grpc_servicer_functions``).

tritonclient's generated classes say they live in ``grpc_service_pb2`` and
``model_config_pb2`` (the names ``protoc`` gave them), not in ``tritonclient.grpc``. Serve
pickles each request and response between its proxy and a replica, and pickle finds a class
by its module's name: without these aliases every call fails in the proxy
("Can't pickle <class 'grpc_service_pb2.ModelInferRequest'>"). Importing this module, in the
proxy (through :func:`add_servicer`) and in a replica, sets them.
"""

from __future__ import annotations

import sys
from typing import Any

from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

sys.modules.setdefault("grpc_service_pb2", service_pb2)
sys.modules.setdefault("model_config_pb2", model_config_pb2)

SERVICER = "crossrt.scaleout.ray.protos.add_servicer"
"""What ``gRPCOptions(grpc_servicer_functions=[...])`` names for KServe v2 on Serve."""


def add_servicer(servicer: Any, server: Any) -> None:
    """``inference.GRPCInferenceService`` on Serve's gRPC proxy (tritonclient's own
    function, after the aliases above are set in the proxy's process)."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
