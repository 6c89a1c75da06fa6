"""Which gradient pushes the aggregator has already handled: its idempotency memory.

    dedup = PushDedup()
    earlier = dedup.answer((learner_id, incarnation, seq))
    if earlier is not None: reply earlier again, apply nothing       # a retry
    else: handle the push, then dedup.record((learner_id, incarnation, seq), ack)

A learner sends its pushes in seq order with at most a few in flight, and retries one until
it is answered; so the memory keeps, per (learner_id, incarnation), the answers to its last
`per_sender` seqs, and any seq at or below the newest one counts as handled. At most
`max_senders` incarnations are remembered (least recently used forgotten first): a learner
restarted with the same id is a new incarnation and starts fresh.

`newest()` gives each sender's newest seq and its answer: the aggregator checkpoints them
with the weights they led to, so a push that a restored checkpoint already holds is answered
as a duplicate after an aggregator restart, never applied twice.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

Ack = TypeVar("Ack")
Key = tuple[int, int, int]  # (learner_id, incarnation, seq)


class PushDedup(Generic[Ack]):
    def __init__(self, per_sender: int = 16, max_senders: int = 4096) -> None:
        if per_sender < 1 or max_senders < 1:
            raise ValueError(f"per_sender ({per_sender}) and max_senders ({max_senders}) must be >= 1")
        self.per_sender = per_sender
        self.max_senders = max_senders
        self._senders: OrderedDict[tuple[int, int], OrderedDict[int, Ack]] = OrderedDict()
        self._newest: dict[tuple[int, int], int] = {}

    def answer(self, key: Key) -> Ack | None:
        """The answer given to this push before, or None when it is new.

        A seq older than those remembered was handled too; its answer is forgotten, so the
        newest remembered answer stands for it (the push is not applied again either way)."""
        sender, seq = key[:2], key[2]
        acks = self._senders.get(sender)
        if acks is None or seq > self._newest[sender]:
            return None
        self._senders.move_to_end(sender)
        if seq in acks:
            return acks[seq]
        return next(reversed(acks.values()))

    def record(self, key: Key, ack: Ack) -> None:
        sender, seq = key[:2], key[2]
        acks = self._senders.setdefault(sender, OrderedDict())
        self._senders.move_to_end(sender)
        acks[seq] = ack
        self._newest[sender] = max(self._newest.get(sender, seq), seq)
        while len(acks) > self.per_sender:
            acks.popitem(last=False)
        while len(self._senders) > self.max_senders:
            gone, _ = self._senders.popitem(last=False)
            del self._newest[gone]

    def newest(self) -> dict[tuple[int, int], tuple[int, Ack]]:
        """(learner_id, incarnation) -> (newest seq handled, its answer)."""
        out = {}
        for sender, acks in self._senders.items():
            seq = self._newest[sender]
            out[sender] = (seq, acks.get(seq, next(reversed(acks.values()))))
        return out

    def __len__(self) -> int:
        return len(self._senders)
