"""Ray Serve wrapping onnxruntime, as Ray's docs show a model deployment (a class with
``@serve.deployment``, ``num_replicas``, an async ``__call__`` taking Starlette's ``Request``,
and a method per gRPC call for Ray Serve's gRPC proxy), for benchmarks/serve_peers.py. Run
with the interpreter of benchmarks/.peers/ray/.

    python ray_server.py --http-port P [--grpc-port Q] --instances 2 NAME=PATH.onnx ...

One application per model, HTTP route ``/v2/models/NAME`` (KServe v2 JSON: ``.../infer``);
with ``--grpc-port``, KServe v2's ``GRPCInferenceService/ModelInfer`` too (the request's
``application`` metadata names the model), from the ``grpc_service_v2_pb2`` modules
serve_peers.py generates on ``PYTHONPATH``. Each replica holds one ORT session of one intra-op
thread. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

import numpy as np
import onnxruntime as ort
from starlette.requests import Request

import ray
from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class OnnxModel:
    """One replica: one ORT session of one intra-op thread."""

    def __init__(self, name: str, path: str) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.name = name
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        feed = {
            i["name"]: np.asarray(i["data"], dtype=np.float32).reshape(i["shape"])
            for i in body["inputs"]
        }
        results = self.session.run(self.outputs, feed)
        return {
            "model_name": self.name,
            "outputs": [
                {"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
                for n, a in zip(self.outputs, results, strict=True)
            ],
        }

    def ModelInfer(self, request: Any) -> Any:
        import grpc_service_v2_pb2 as pb

        feed = {}
        for k, spec in enumerate(request.inputs):
            if request.raw_input_contents:
                flat = np.frombuffer(request.raw_input_contents[k], np.float32)
            else:
                flat = np.asarray(spec.contents.fp32_contents, np.float32)
            feed[spec.name] = flat.reshape(list(spec.shape))
        results = self.session.run(self.outputs, feed)
        reply = pb.ModelInferResponse(model_name=self.name, id=request.id)
        for n, a in zip(self.outputs, results, strict=True):
            reply.outputs.add(name=n, datatype="FP32", shape=list(a.shape))
            reply.raw_output_contents.append(np.ascontiguousarray(a).tobytes())
        return reply


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, default=0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("models", nargs="+", help="NAME=PATH.onnx")
    args = p.parse_args()
    # The grpc_service_v2_pb2 modules: on PYTHONPATH (serve_peers.py sets it), which Ray's
    # workers inherit; the proxy imports the servicer function by name.
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False)
    grpc_options = None
    if args.grpc_port:
        grpc_options = serve.config.gRPCOptions(
            port=args.grpc_port,
            grpc_servicer_functions=[
                "grpc_service_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"
            ],
        )
    serve.start(
        http_options={"host": "127.0.0.1", "port": args.http_port}, grpc_options=grpc_options
    )
    for name, path in (spec.split("=", 1) for spec in args.models):
        app = OnnxModel.options(num_replicas=args.instances).bind(name, path)
        serve.run(app, name=name, route_prefix=f"/v2/models/{name}", blocking=False)
    print("ray serve: ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
