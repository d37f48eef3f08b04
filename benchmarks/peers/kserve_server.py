"""KServe's Python model server wrapping onnxruntime, as KServe's docs show a custom model
(``kserve.Model`` with ``load`` and ``predict``, served by ``kserve.ModelServer``), for
benchmarks/serve_peers.py. Run with the interpreter of benchmarks/.peers/kserve/.

    python kserve_server.py --http-port P --grpc-port Q --instances 2 NAME=PATH.onnx ...

Each model holds ``--instances`` ONNX Runtime sessions of one intra-op thread each, run from a
thread pool of that size (KServe calls ``predict`` on its event loop, so a blocking ``run``
there would serialise every request of every model).
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxModel(Model):
    """A v2-protocol model: ``instances`` sessions of one ORT thread each."""

    def __init__(self, name: str, path: str, instances: int) -> None:
        super().__init__(name)
        self.path = path
        self.instances = instances
        self.pool = ThreadPoolExecutor(instances, thread_name_prefix=name)
        self.sessions: queue.SimpleQueue[ort.InferenceSession] = queue.SimpleQueue()
        self.load()

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        for _ in range(self.instances):
            self.sessions.put(
                ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
            )
        self.ready = True
        return self.ready

    def _run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions.get()
        try:
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feed), strict=True))
        finally:
            self.sessions.put(session)

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None, response_headers=None
    ) -> InferResponse:
        feed = {i.name: i.as_numpy() for i in payload.inputs}
        outputs = await asyncio.get_running_loop().run_in_executor(self.pool, self._run, feed)
        infer_outputs = []
        for name, array in outputs.items():
            out = InferOutput(name=name, shape=list(array.shape), datatype="FP32")
            out.set_data_from_numpy(array, binary_data=False)
            infer_outputs.append(out)
        return InferResponse(
            model_name=self.name,
            infer_outputs=infer_outputs,
            response_id=payload.id or str(uuid.uuid4()),  # KServe's examples do the same
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("models", nargs="+", help="NAME=PATH.onnx")
    args = p.parse_args()
    models = [
        OnnxModel(name, path, args.instances)
        for name, path in (spec.split("=", 1) for spec in args.models)
    ]
    ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, workers=1).start(models)


if __name__ == "__main__":
    main()
