"""The trap between Serve's proxy and a replica: each request and answer is pickled, and
tritonclient's generated KServe classes name their module ``grpc_service_pb2``, which no
process can import. crossrt.scaleout.ray.protos sets the alias (in the proxy through its
servicer function, in each replica on import)."""

from __future__ import annotations

import subprocess
import sys

ROUND_TRIP = (
    "import pickle; from tritonclient.grpc import service_pb2 as pb; "
    "r = pb.ModelInferRequest(model_name='m'); "
    "assert pickle.loads(pickle.dumps(r)).model_name == 'm'"
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_kserve_messages_do_not_pickle_without_the_alias() -> None:
    done = run(ROUND_TRIP)
    assert done.returncode != 0 and "grpc_service_pb2" in done.stderr


def test_kserve_messages_pickle_once_protos_is_imported() -> None:
    done = run("import crossrt.scaleout.ray.protos; " + ROUND_TRIP)
    assert done.returncode == 0, done.stderr
