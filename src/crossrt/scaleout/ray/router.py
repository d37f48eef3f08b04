"""Serve's request router for crossrt's deployments: each request goes to the replica that holds
the fewest of this router's requests in flight.

Serve's own router (power of two choices) ranks replicas by a cache of their queue lengths. Over
the gRPC transport between Serve's proxy and its replicas (``RAY_SERVE_PROXY_USE_GRPC=1``, one of
:data:`.app.SERVE_ENV`'s switches) a replica's answer to "do you accept it, and how many do you
hold?" reaches the proxy only when the request has finished (Ray 2.60; seen from this router's
hooks). The cache then holds each replica's count as it was when a past request arrived, not
now: on a node of two one-core ResNet-50 replicas, each held no request for 14-35 % of the time
(sampled every 5 ms, 4 and 8 clients) while the other held the rest, and 10-19 % of the host's
CPU went unused (benchmarks/results/ray_serve_resnet50_maxongoing32.md). A replica that shares
its cores with nobody cannot take up that slack, as an unpinned one can. In the tests'
two-node cluster, four clients got 69 requests answered in 8 s through Serve's router and 114
through this one (tests/ray/test_fleet.py).

This router counts, for each replica, the requests it sent there that have not finished (Serve
tells a router both: :meth:`on_send_request` and :meth:`on_request_completed`), which is exact for
the requests that pass through it, and ranks the replicas by that count, then by locality (a
replica on the router's node, then in its zone), then by how long ago each was chosen. So a
replica on another node with nothing to do is preferred to a busy one on this node, where
Serve's router tries this node's replicas first until they are full: a request of a model that
computes for milliseconds gains more from an idle core than it loses in a hop. Multiplexing
picks the candidates as in Serve's own router. Serve's queue-length cache still guards
``max_ongoing_requests``: a replica the cache says is full is asked before it is sent more.

Each router counts the requests that pass through it: Serve runs one proxy per node, and a
replica's count in one proxy leaves out what the other proxies (and handles) sent it. With
traffic entering through several proxies, each balances its own share, and
``max_ongoing_requests`` still caps what a replica accepts from all of them.

Serve pickles this module by value into every process that routes (its proxies, handles): it
imports nothing of crossrt.
"""

from __future__ import annotations

import itertools
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

STICKY = frozenset(
    {
        "ServerLive",
        "ServerReady",
        "ServerMetadata",
        "ModelReady",
        "ModelMetadata",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    }
)
"""The KServe v2 methods a replica answers from its own state: each goes to the same replica
every time (the nearest), not by requests in flight. A replica's statistics are its own, and a
client that reads them before and after its requests (perf_analyzer) must read one replica's
both times; Serve's router kept them on one replica too, by locality."""


class FewestInFlight(FIFOMixin, LocalityMixin, MultiplexMixin, RequestRouter):
    """Serve's request router (``request_router_config``) that sends each request to a
    candidate replica holding the fewest of this router's requests in flight (of those
    holding as many, the nearest, then the one chosen longest ago); the others follow, as the
    fallback Serve tries when that one is full."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._in_flight: dict[ReplicaID, int] = {}
        # when each replica was last chosen (a counter): of replicas holding as many, the one
        # chosen longest ago goes first, so that two requests routed at once (the second
        # chosen before the first is sent and counted) go to two replicas
        self._chosen: dict[ReplicaID, int] = {}
        self._ticks = itertools.count()

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self._in_flight[replica_id] = self._in_flight.get(replica_id, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        # Every request sent has its completion reported once, also when the replica
        # rejected it (full) or died; a count never goes below zero.
        super().on_request_completed(replica_id, internal_request_id)
        left = self._in_flight.pop(replica_id, 0) - 1
        if left > 0:
            self._in_flight[replica_id] = left

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        # a replica gone (scaled down, replaced) leaves no state here; its counts go to zero
        # as its last requests finish
        current = {r.replica_id for r in replicas}
        for gone in set(self._chosen) - current:
            del self._chosen[gone]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._in_flight.pop(replica_id, None)
        self._chosen.pop(replica_id, None)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        replicas = self.curr_replicas
        if pending_request is not None and pending_request.metadata.multiplexed_model_id:
            ids = self.apply_multiplex_routing(pending_request=pending_request)
        else:
            ids = set(replicas)
            if pending_request is not None:  # every replica is tried: back off when all are full
                pending_request.routing_context.should_backoff = True
        candidates = [replicas[i] for i in ids if i in replicas]
        if not candidates:
            return []
        near = {
            r.replica_id: rank
            for rank, group in enumerate(self.rank_replicas_via_locality(candidates))
            for r in group
        }
        if pending_request is not None and pending_request.metadata.call_method in STICKY:
            ranked = sorted(candidates, key=lambda r: (near[r.replica_id], r.replica_id.unique_id))
        else:
            ranked = sorted(
                candidates,
                key=lambda r: (
                    self._in_flight.get(r.replica_id, 0),
                    near[r.replica_id],
                    self._chosen.get(r.replica_id, -1),
                ),
            )
            self._chosen[ranked[0].replica_id] = next(self._ticks)
        return [ranked[:1], ranked[1:]] if len(ranked) > 1 else [ranked]
