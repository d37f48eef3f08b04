"""What test_regions runs in another process, possibly as another user: a new interpreter
(``python -B region_client.py URL CASE KEY``, one JSON line on stdout), never a fork of the
test process, whose gRPC and ONNX Runtime threads can leave a forked child hanging in gRPC."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as tc
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from crossrt.errors import CrossrtError
from crossrt.server.lane_client import LaneClient


def status_of(call: Callable[[], object]) -> str:
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


def other_user(c: tc.InferenceServerClient, key: str, url: str) -> dict[str, Any]:
    """As another user: use (over gRPC and the direct lane), steal, unregister and list
    root's region; then one of its own."""
    out: dict[str, Any] = {}
    x = tc.InferInput("x", [4, 8], "FP32")
    x.set_shared_memory("root-region", 128)
    out["use"] = status_of(lambda: c.infer("tiny", [x]))
    request = pb.ModelInferRequest(model_name="tiny")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[4, 8])
    tensor.parameters["shared_memory_region"].string_param = "root-region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 128
    lane = LaneClient(url.removeprefix("unix://"), None, 30.0, url)
    try:
        lane.infer(request)
        out["use_lane"] = "OK"
    except CrossrtError as exc:
        out["use_lane"] = f"{type(exc).__name__}: {exc}"
    lane.close()
    out["register_root_file"] = status_of(
        lambda: c.register_system_shared_memory("steal", key, 256)
    )
    out["unregister"] = status_of(lambda: c.unregister_system_shared_memory("root-region"))
    out["listed"] = list(c.get_system_shared_memory_status().regions)
    own_key = f"/crossrt-own-{os.getpid()}"
    own = shm.create_shared_memory_region("own", own_key, 128)
    shm.set_shared_memory_region(own, [np.ones((4, 8), np.float32)])
    out["register_own"] = status_of(lambda: c.register_system_shared_memory("own", own_key, 128))
    x.set_shared_memory("own", 128)
    out["y"] = c.infer("tiny", [x]).as_numpy("y").tolist()
    c.unregister_system_shared_memory("own")
    shm.destroy_shared_memory_region(own)
    return out


def dead_process(c: tc.InferenceServerClient, key: str, url: str) -> dict[str, Any]:
    """Register a region, list it, and end without unregistering."""
    c.register_system_shared_memory("dead-region", key, 64)
    return {"listed": list(c.get_system_shared_memory_status().regions)}


CASES = {"other_user": other_user, "dead_process": dead_process}

if __name__ == "__main__":
    url, case, key = sys.argv[1:4]
    try:
        result = CASES[case](tc.InferenceServerClient(url), key, url)
    except BaseException as exc:
        result = {"error": repr(exc)}
    print(json.dumps(result), flush=True)
