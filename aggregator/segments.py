"""Where the aggregator keeps weights ready to send, and the shared-memory segments of one host.

    cache = WeightsCache()
    msg = cache.get(core, groups)                 # serialized once per version, for every stream
    segment = cache.segment(core, groups)         # same-host readers: /dev/shm, written per version
    grads = GradientSegments().gradients(request, tensors, core.sizes)   # a learner's segment

Both are used under the servicer's lock (servicer.py) and closed with it.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter

import numpy as np

from aggregator.core import AggregatorCore
from foundation.policy import GRADIENT_GROUPS, ModelSpec
from foundation.proto import fleetrl_pb2 as pb
from foundation.shm import SharedWeightsReader, SharedWeightsWriter
from foundation.wire import WireError, cap, to_tensor

log = logging.getLogger("fleetrl.aggregator")


class WeightsCache:
    """Serialized Weights per group selection, rebuilt once per version, shared by subscribers;
    and, for same-host subscribers, the shared-memory segment per group selection, written on
    every version while a stream reads it."""

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, ...], str], pb.Weights] = {}  # (groups, "plain"|"offer")
        self.segments: dict[tuple[str, ...], SharedWeightsWriter] = {}
        self.readers: Counter[tuple[str, ...]] = Counter()  # streams reading each segment

    def get(
        self, core: AggregatorCore, groups: tuple[str, ...], offer: SharedWeightsWriter | None = None
    ) -> pb.Weights:
        """The weights themselves; with `offer`, naming the segment that holds them too."""
        key = (groups, "plain" if offer is None else "offer")
        cached = self._cache.get(key)
        if cached is not None and cached.version == core.version:
            return cached
        flat = core.views(groups)  # no copy: to_tensor copies once, under the caller's lock
        msg = pb.Weights(
            version=core.version,
            tensors=[to_tensor(g, flat[g]) for g in groups],
            layout=layout(core.spec),
            shared=shared_segment(offer),
        )
        self._cache[key] = msg
        return msg

    def write(self, core: AggregatorCore, groups: tuple[str, ...]) -> bool:
        """The current version into this selection's segment, once; True if written."""
        segment = self.segments[groups]
        if segment.version == core.version:
            return False
        segment.write(core.version, core.views(groups))
        return True

    def segment(self, core: AggregatorCore, groups: tuple[str, ...]) -> SharedWeightsWriter | None:
        """This selection's segment, made on first use; None where /dev/shm cannot be used."""
        if groups not in self.segments:
            try:  # no /dev/shm (not Linux, or not writable) is an OSError too
                self.segments[groups] = SharedWeightsWriter({g: v.size for g, v in core.views(groups).items()})
            except OSError as err:
                log.warning("weights stay on gRPC: no shared-memory segment (%s)", err)
                return None
        return self.segments[groups]

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


class GradientSegments:
    """Same-host learners' gradient segments, mapped on first use (a bounded few)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._readers: dict[tuple[str, int], SharedWeightsReader] = {}

    def gradients(
        self, request: pb.Gradients, tensors: dict[str, np.ndarray], sizes: dict[str, int]
    ) -> dict[str, np.ndarray]:
        """The push's gradient groups, copied from its segment; WireError naming the field when
        the segment cannot be read here or does not hold this push."""
        inline = sorted(name for name in tensors if name != "norm_stats")
        if inline:
            raise WireError("tensors", f"{[cap(n, 30) for n in inline[:3]]} as well as shared: one place per push")
        where, key = request.shared.path, request.shared.key
        reader = self._readers.get((where, key))
        if reader is None:
            try:
                reader = SharedWeightsReader(where, key, {g: sizes[g] for g in GRADIENT_GROUPS})
            except FileNotFoundError:
                raise WireError("shared.path", f"{cap(where)}: no such segment on the aggregator's host") from None
            except PermissionError:
                raise WireError("shared.path", f"{cap(where)}: not readable by the aggregator's user") from None
            except (OSError, ValueError) as err:
                raise WireError("shared", cap(str(err), 300)) from None
            if len(self._readers) >= self.LIMIT:  # learners that left: drop the oldest mapping
                self._readers.pop(next(iter(self._readers))).close()
            self._readers[(where, key)] = reader
        read = reader.read()  # no wait: the learner finished writing before it pushed
        if read is None or read[0] != request.seq:
            held = "nothing readable" if read is None else f"push {read[0]}"
            raise WireError("shared", f"the segment holds {held}, not seq {request.seq}")
        return read[1]

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


@functools.lru_cache(maxsize=8)
def layout(spec: ModelSpec) -> str:
    """The spec's JSON, serialized once per spec rather than once per version sent."""
    return spec.to_json()


def shared_segment(segment: SharedWeightsWriter | None) -> pb.SharedSegment | None:
    return None if segment is None else pb.SharedSegment(path=segment.path, key=segment.key)
