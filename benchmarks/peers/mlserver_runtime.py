"""An MLServer custom runtime wrapping onnxruntime, as MLServer's docs show one (an
``MLModel`` with ``load`` and ``predict``, inputs and outputs through ``NumpyCodec``): MLServer
ships no ONNX runtime of its own. benchmarks/serve_peers.py writes each model's
``model-settings.json`` (``implementation: mlserver_runtime.OnnxModel``, ``parameters.uri``:
the .onnx file) and runs ``mlserver start`` with ``parallel_workers`` = the instances: each
worker process holds one session of one intra-op thread.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    """One ORT session of one intra-op thread per MLServer worker."""

    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        uri = self.settings.parameters.uri if self.settings.parameters else None
        self._session = ort.InferenceSession(uri, options, providers=["CPUExecutionProvider"])
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self._session.run(self._outputs, feed)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output(name, array)
                for name, array in zip(self._outputs, results, strict=True)
            ],
        )
