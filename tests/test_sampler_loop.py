"""The sampler's loop (sampler.worker.Collector) on a real FetchReach env, its peers faked: the
pusher and the weights watcher check every call against the real classes' signatures."""

from __future__ import annotations

import inspect
import json
import pathlib
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from foundation.config import RunConfig, with_overrides
from foundation.process import Heartbeat
from foundation.wire import Transitions
from sampler.pusher import Pusher
from sampler.worker import Collector
from sim.registry import get_task
from sim.tasks import TaskSet


@dataclass
class FakePusher:
    """Records put() calls, bound to Pusher.put's signature; sets `stop` after `stop_after` puts.

    `held_polls`: each put() waits that many half seconds on flow control (rate_limited_sec up
    0.4 s each), calling its on_held at each, as Pusher.put does; `heartbeat_path`: the file
    read after each on_held, into `beats_while_held`."""

    incarnation: int = 1
    stop_after: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    puts: list[dict[str, Any]] = field(default_factory=list)
    rate_limited_sec: float = 0.0
    acked_env_steps: int = 0
    held_polls: int = 0
    heartbeat_path: pathlib.Path | None = None
    beats_while_held: list[dict[str, Any]] = field(default_factory=list)

    def put(self, *args: Any, **kwargs: Any) -> None:
        call = inspect.signature(Pusher.put).bind(self, *args, **kwargs)
        call.apply_defaults()
        assert isinstance(call.arguments["transitions"], Transitions)
        assert call.arguments["policy_version"] >= 0 and call.arguments["env_steps"] > 0
        for _ in range(self.held_polls):
            self.rate_limited_sec += 0.4
            if call.arguments["on_held"] is not None:
                call.arguments["on_held"]()
            if self.heartbeat_path is not None:
                self.beats_while_held.append(json.loads(self.heartbeat_path.read_text()))
        self.puts.append(dict(call.arguments))
        self.acked_env_steps += call.arguments["env_steps"]
        if self.stop_after is not None and len(self.puts) >= self.stop_after:
            self.stop.set()


class NoWeights:
    """A weights watcher (aggregator.watcher.WeightsWatcher) that has no snapshot yet."""

    def latest(self) -> None:
        return None


def _collector(pusher: FakePusher, config: RunConfig | None = None, heartbeat: Heartbeat | None = None) -> Collector:
    config = config or with_overrides(RunConfig(), ['sim.task="FetchReach-v4"', "sampler.her_k=2"])
    tasks = TaskSet.for_run(config)
    env = tasks.make_env(0)
    # one task: no schedule, so no aggregator client (None); the fakes stand for the real peers
    return Collector(config, 0, [env], [0], None, NoWeights(), pusher, heartbeat or Heartbeat(None))


def test_a_step_is_one_episode_pushed_with_its_env_steps_version_and_task():
    pusher = FakePusher()
    collector = _collector(pusher)
    assert collector.step() == 50
    (put,) = pusher.puts
    assert (put["env_steps"], put["policy_version"], put["task_id"]) == (50, 0, get_task("FetchReach-v4").task_id)
    assert put["successes"] in (0, 1) and len(put["transitions"]) == 3 * 50  # each step and 2 HER copies
    assert (collector.env_steps, collector.episodes) == (50, 1)
    assert collector.heartbeat.counters["env_steps"] == 50 and collector.heartbeat.counters["acked_env_steps"] == 50


def test_a_step_held_back_by_flow_control_keeps_its_heartbeat_fresh(tmp_path):
    """put() waiting on flow control beats the heartbeat file the watchdog reads, each beat
    newer and carrying the rate_limited_sec so far, before the episode is counted."""
    path = tmp_path / "sampler-0.json"
    pusher = FakePusher(held_polls=3, heartbeat_path=path)
    collector = _collector(pusher, heartbeat=Heartbeat(path, interval_sec=0.0))
    collector.step()
    beats = pusher.beats_while_held
    assert [round(b["counters"]["rate_limited_sec"], 6) for b in beats] == [0.4, 0.8, 1.2]
    assert all("episodes" not in b["counters"] for b in beats)  # written inside the wait, not after it
    assert json.loads(path.read_text())["counters"]["episodes"] == 1


def test_run_collects_until_stopped_and_returns_the_env_steps():
    pusher = FakePusher(stop_after=3)
    assert _collector(pusher).run(pusher.stop) == 150
    assert len(pusher.puts) == 3


@pytest.mark.parametrize("incarnation,same", [(1, True), (2, False)])
def test_a_restarted_sampler_never_replays_its_previous_lifes_episodes(incarnation, same):
    first, again = FakePusher(incarnation=1), FakePusher(incarnation=incarnation)
    _collector(first).step()
    _collector(again).step()
    a, b = first.puts[0]["transitions"], again.puts[0]["transitions"]
    assert np.array_equal(a.action, b.action) == same
