"""The buffer's flow control: samples per insert, kept by both sides (Reverb's SampleToInsertRatio).

    limit = rate_limit(config)                  # None when the run sets no ratio
    limit.insert_ok(inserted, sampled, n)        # the ingest service, before storing n rows
    limit.sample_ok(inserted, sampled, n)        # a learner, before drawing n rows
    SampleLimiter(limit).wait(...)               # ... as a learner's ReplaySampler waits

`inserted` counts rows stored (the committed head), `sampled` rows drawn by every learner of
the run (a counter in Redis that learners add to as they refresh). With SPI sampled rows per
inserted row, a minimum size M and an error buffer E (Reverb's semantics, in rows):

    diff = inserted * SPI - sampled
    insert n rows  while  diff + n * SPI <= SPI * M + E     (samplers wait when learners lag)
    sample n rows  once   inserted >= M  and  diff - n >= SPI * M - E   (learners wait when samplers lag)

The run states the ratio the RL way, `sampler.max_env_steps_per_update` (env steps per
gradient of `learner.batch_size` rows, each env step stored as 1 + her_k rows), so
SPI = batch_size / (max_env_steps_per_update * (1 + her_k)); M is
`learner.min_replay_transitions`; E lets the samplers' random warm-up
(`sampler.random_steps` each) and the run's demonstrations (`sampler.demo_episodes` per task)
in ahead of any sampling, plus one push of the run's longest episode: a push is stored whole,
and a smaller E stops both sides (longest_push_rows). `buffer.samples_per_insert` and
`buffer.rate_tolerance_rows` override the derived values.

The ratio is kept in rows, so it is exactly max_env_steps_per_update env steps per gradient only
where every env step is stored as 1 + her_k rows. An episode that moved nothing under
`sampler.her_k_unmoved` 0 stores 1 row per step: its env steps count 1 / (1 + her_k) of one, and
while few episodes move the object the samplers run up to 1 + her_k times the named ratio
(the FetchPush-v4 preset, 4 per gradient: 7.1-8.0 env steps per version over the run to 90%;
MetaWorld-push alone, which moves the puck in 2-4% of episodes: about 20). Every preset was
measured this way: the rows are the learner's work, which is what the ratio paces.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from foundation.config import RunConfig
from sim.registry import get_task, training_episode_steps

_ROUNDING = 1e-6  # sampled rows: a ratio like 25.6 is not exact in binary
RATE_LIMITED = "rate limited"  # how a RESOURCE_EXHAUSTED answer of flow control begins
# A push refused by flow control is offered again after 25 ms, then 50, ... up to 400 ms: the
# learners' tolerance covers that much latency many times over, and the buffer parses fewer
# re-sent batches (a rate-limited sampler re-sent one every 10 ms at first: 40 RPCs/s).
RATE_LIMITED_POLL_SEC = 0.025
RATE_LIMITED_MAX_SEC = 0.4


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class SampleToInsertRatio:
    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float  # in sampled rows

    @property
    def _offset(self) -> float:
        return self.samples_per_insert * self.min_size_to_sample

    def insert_ok(self, inserted: int, sampled: int, n: int) -> bool:
        diff = inserted * self.samples_per_insert - sampled
        return diff + n * self.samples_per_insert <= self._offset + self.error_buffer + _ROUNDING

    def sample_ok(self, inserted: int, sampled: int, n: int) -> bool:
        if inserted < self.min_size_to_sample:
            return False
        diff = inserted * self.samples_per_insert - sampled
        return diff - n >= self._offset - self.error_buffer - _ROUNDING

    def inserts_allowed(self, inserted: int, sampled: int) -> int:
        """Rows that may be inserted now (0 when inserts must wait)."""
        room = self._offset + self.error_buffer - (inserted * self.samples_per_insert - sampled)
        return max(0, int((room + _ROUNDING) / self.samples_per_insert))


def rate_limit(config: RunConfig) -> SampleToInsertRatio | None:
    """The run's limiter; None without a ratio (max_env_steps_per_update <= 0, no override)."""
    b, s, learner = config.buffer, config.sampler, config.learner
    rows_per_step = 1 + s.her_k
    spi = b.samples_per_insert
    if spi <= 0:
        if s.max_env_steps_per_update <= 0:
            return None
        spi = learner.batch_size / (s.max_env_steps_per_update * rows_per_step)
    warmup_rows = (s.random_steps * s.num_samplers + demo_steps(config)) * rows_per_step
    ahead_rows = max(warmup_rows - learner.min_replay_transitions, 0)
    tolerance_rows = b.rate_tolerance_rows or ahead_rows + longest_push_rows(config)
    return SampleToInsertRatio(spi, learner.min_replay_transitions, spi * tolerance_rows)


def demo_steps(config: RunConfig) -> int:
    """Env steps of the run's demonstrations (sampler.demo_episodes training episodes per task),
    stored ahead of sampling like the warm-up."""
    tasks = config.sim.tasks or (config.sim.task,)
    episode = sum(training_episode_steps(get_task(t), config.sim.control_hz) for t in tasks)
    return config.sampler.demo_episodes * episode


def longest_push_rows(config: RunConfig) -> int:
    """Rows of the largest push a sampler makes: one training episode of the run's longest task,
    each env step stored as 1 + her_k rows.

    The ingest service stores a push whole or not at all, so the error buffer must hold one:
    with samplers waiting for room for n rows and learners for b more rows, both wait for ever
    once 2E < n * SPI + b. An error buffer of one longest push (plus the warm-up) keeps
    2E >= n * SPI + b whenever a gradient's rows are at most a push's (tests/test_ratelimit.py)."""
    tasks = config.sim.tasks or (config.sim.task,)
    steps = max(training_episode_steps(get_task(t), config.sim.control_hz) for t in tasks)
    return steps * (1 + config.sampler.her_k)


def tolerance_problem(config: RunConfig) -> str | None:
    """Why the run's buffer.rate_tolerance_rows would stop samplers and learners for good, or None."""
    limit, set_rows = rate_limit(config), config.buffer.rate_tolerance_rows
    if limit is None or not set_rows:
        return None
    push = longest_push_rows(config)
    gradient_rows = config.learner.batch_size / limit.samples_per_insert
    if 2 * set_rows < push + gradient_rows:
        return (
            f"buffer.rate_tolerance_rows ({set_rows}) must be at least {int((push + gradient_rows + 1) // 2)}: "
            f"half of one push ({push} rows: the run's longest episode) and one gradient's rows "
            f"({gradient_rows:g}), or samplers and learners wait on each other for ever"
        )
    return None


class SampleLimiter:
    """A learner's side of a SampleToInsertRatio: the rows it drew, reported to the run's counter,
    and the wait before a batch the ratio does not allow yet.

        limiter = SampleLimiter(limit)
        limiter.wait(inserted=lambda: ring.read_upto, batch_size=256, stop=stop, refresh=cache_refresh)
        limiter.drawn(256)                       # after sample()
        limiter.report(storage.add_sampled)      # at refresh: the run's total comes back
    """

    def __init__(self, limit: SampleToInsertRatio) -> None:
        self.limit = limit
        self.sampled = 0  # rows sampled by every learner of the run, as of the last report
        self.unreported = 0  # rows this learner sampled since
        self.rate_limited_sec = 0.0  # time spent waiting in wait()

    def drawn(self, rows: int) -> None:
        self.unreported += rows

    def report(self, add_sampled: Callable[[int], int]) -> None:
        """Add the unreported rows to the run's counter; `add_sampled` returns the run's total."""
        self.sampled, self.unreported = add_sampled(self.unreported), 0

    def wait(
        self,
        inserted: Callable[[], int],
        batch_size: int,
        stop: threading.Event,
        refresh: Callable[[], object],
        on_wait: Callable[[], object] = _nothing,
    ) -> bool:
        """Wait until the ratio lets `batch_size` more rows be sampled, calling `refresh` (which
        updates `inserted()` and reports) every RATE_LIMITED_POLL_SEC; False once `stop` is set.

        `on_wait()` runs at every poll that finds no room, never when the first check does (a
        heartbeat: waiting on the samplers is not hanging). A wait stuck anywhere, in `refresh`
        included, calls it no more, so a learner hung in its wait still goes silent."""
        waited = time.monotonic()
        while not self.limit.sample_ok(inserted(), self.sampled + self.unreported, batch_size):
            on_wait()
            if stop.wait(RATE_LIMITED_POLL_SEC):
                return False
            refresh()
        self.rate_limited_sec += time.monotonic() - waited
        return True
