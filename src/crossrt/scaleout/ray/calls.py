"""Who calls a replica and which model a call is for: what the gRPC and HTTP sides share."""

from __future__ import annotations

from ...server.peers import Peer

ANONYMOUS = Peer("ray-serve", local=False)
"""Every caller through Serve: its proxy hides the client's connection, and a token would
name a user of one host only."""

SAME_HOST_ONLY = (
    "system shared memory is served by `crossrt serve` on the client's own host; through "
    "Ray Serve send the tensors in the request"
)


def model_id(name: str) -> str:
    """The model a request is for: Serve's multiplexed model id when the client sent one
    (``multiplexed_model_id``: routed to a replica holding it), else the name it asks."""
    try:
        from ray import serve

        chosen = serve.get_multiplexed_model_id()
    except Exception:  # outside a request's context
        chosen = ""
    return chosen or name
