"""``crossrt serve``: the runtime behind gRPC, speaking the KServe v2 inference protocol
(``docs/daemon.md``). Needs the ``serve`` extra (grpcio, tritonclient's protocol modules,
prometheus-client); nothing here is imported by ``import crossrt``."""
