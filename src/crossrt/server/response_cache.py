"""The daemon's response cache (Triton's): the answers of models loaded with
``response_cache``, kept by what was asked, so that a request asked before is answered
without running the model.

One cache per daemon, bounded in bytes (``response_cache_bytes``; least recently used
answers go first). A request's key is a BLAKE2b digest of the model's load (a model loaded
again never answers from the answers of the one before), the outputs asked for, and each
input's name, dtype, shape and bytes, wherever they came from (the message or a shared-memory
region). A request is neither looked up nor kept when an output goes to a shared-memory
region (the answer is written there, not carried), or an input holds strings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.statistics import Duration, ModelStatistics


@dataclass
class CacheCounts:
    """What a model's requests found in the cache, and the time it took (ns)."""

    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


def with_cache_hits(stats: ModelStatistics, cache: CacheCounts) -> ModelStatistics:
    """A model's statistics with the requests the response cache answered counted as
    successes (their latency the lookup's), as Triton counts them."""
    if not cache.hits:
        return stats
    return dataclasses.replace(
        stats,
        requests=stats.requests + cache.hits,
        success=stats.success + cache.hits,
        latency=Duration(stats.latency.count + cache.hits, stats.latency.ns + cache.hit_ns),
    )


class ResponseCache:
    """Serialized ``ModelInferResponse`` messages by request key, at most ``limit`` bytes.

    Args:
        limit: the most bytes of answers kept.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._answers: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @staticmethod
    def key(load: str, feed: Mapping[str, Any], outputs: Sequence[str]) -> bytes | None:
        """The key of a request to the model load ``load`` with inputs ``feed`` asking for
        ``outputs``; ``None`` when it cannot be cached (an input of strings)."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(load.encode())
        for name in outputs:
            digest.update(b"\0out\0" + name.encode())
        for name in sorted(feed):
            array = np.asarray(feed[name])
            if array.dtype == object:
                return None
            header = f"\0in\0{name}\0{array.dtype.str}\0{array.shape}\0".encode()
            digest.update(header)
            digest.update(np.ascontiguousarray(array).view(np.uint8).data)
        return digest.digest()

    def get(self, key: bytes) -> bytes | None:
        """The answer kept for ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
            return answer

    def put(self, key: bytes, answer: bytes) -> None:
        """Keep ``answer`` for ``key``, dropping the least recently used answers to make
        room; one larger than the whole cache is not kept."""
        if len(answer) > self.limit:
            return
        with self._lock:
            old = self._answers.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            while self._answers and self._bytes + len(answer) > self.limit:
                _, dropped = self._answers.popitem(last=False)
                self._bytes -= len(dropped)
                self.evictions += 1
            self._answers[key] = answer
            self._bytes += len(answer)

    @property
    def size(self) -> int:
        """Bytes of answers kept."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._answers)
