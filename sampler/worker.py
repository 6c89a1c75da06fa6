"""The sampler role process: act in a randomized sim, relabel with HER, push to the buffer.

    demonstrate()                                 # sampler.demo_episodes: its share, once per run
    while running:                                # Collector.run: one step() per episode
        policy.refresh(watcher.latest())          # newest actor weights, never blocks
        episode = rollout(env, policy)            # stochastic actions (random for the first steps)
        batch = relabel_future(episode, k)        # HER 'future' (sim.reward "shaped": own_reward_rows)
        pusher.put(batch, on_held=beat)           # sampler/pusher.py: a background thread pushes until acked

The buffer's flow control (buffer/ratelimit.py) keeps the fleet from running ahead of the
learners: past the samplers' warm-up (`random_steps` each), the ingest service holds pushes
back while learners lag the run's replay ratio (`max_env_steps_per_update` env steps per
gradient), the pusher's short queue fills and put() waits. The wait beats the heartbeat, its
`rate_limited_sec` growing, so the watchdog never takes a held-back sampler for a hung one. On a
small machine the CPU then goes where it buys learning.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

import grpc
import numpy as np

from aggregator.client import AggregatorClient, WeightsWatcher
from buffer.ingest_client import IngestClient
from foundation.acting import Episode, Policy, rollout
from foundation.config import RunConfig
from foundation.ledger import AckLedger
from foundation.policy import ACTOR_GROUPS
from foundation.process import Heartbeat
from foundation.task_schedule import TaskPicker, TaskSchedule
from foundation.transport import Security
from foundation.wire import Transitions
from sampler.demos import demo_envs, demo_plan, demonstrate
from sampler.hardening import harden
from sampler.her import own_reward_rows, relabel_future
from sampler.pusher import Pusher
from sim.registry import goal_reward
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.sampler")
TRAIN_SEEDS_FROM = 2**21  # evaluation seeds start at EvalConfig.seed (1e6 by default), below this


@dataclass(frozen=True)
class SamplerEndpoints:
    buffer: str  # host:port of a buffer ingest service
    aggregator: str  # host:port of the aggregator
    ack_log_dir: str | None = None  # AckLedger files: every acked batch, for audits and fault tests


def run_sampler(
    config: RunConfig,
    sampler_id: int,
    endpoints: SamplerEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """The sampler role (foundation/role.py): collect and push until `stop` is set; returns env
    steps acked. The envs, the pusher and the ledger are closed on the way out, on an error too."""
    cfg = config.sampler
    tasks = TaskSet.for_run(config)
    mine = tasks.assigned(sampler_id, cfg.num_samplers)  # task places, env steps shared by TaskPicker
    envs: list = []
    try:
        envs.extend(tasks.training_env(i, config) for i in mine)
        _harden(config, sampler_id, [tasks.names[i] for i in mine])
        with (
            AggregatorClient(endpoints.aggregator, security=security) as agg,
            agg.watch(f"sampler-{sampler_id}", ACTOR_GROUPS, cfg.weights_interval_sec) as watcher,
            _ingest_client(config, sampler_id, endpoints.buffer, security) as ingest,
        ):
            ledger = None
            if endpoints.ack_log_dir:
                ledger = AckLedger(endpoints.ack_log_dir, f"sampler-{sampler_id}", ingest.incarnation)
            try:
                # Flow control is the buffer's (buffer/ratelimit.py): while learners lag, the ingest
                # service holds pushes back, this queue fills and put() waits. Two batches queued at
                # most: an episode collected while it waits is at most two episodes old when stored.
                pusher = Pusher(ingest, tasks.tasks[mine[0]], max_pending=2, ledger=ledger, halt=stop)
                steps = _collect(Collector(config, sampler_id, envs, mine, agg, watcher, pusher, heartbeat), stop)
                heartbeat.close(acked_env_steps=pusher.acked_env_steps)
            finally:
                if ledger is not None:
                    ledger.close()
    finally:
        for env in envs:
            env.close()
    acked, dropped = pusher.acked_env_steps, pusher.dropped
    log.info(
        "sampler %d: stopped after %d env steps (%d acked, %d batches dropped unacked)",
        sampler_id,
        steps,
        acked,
        dropped,
    )
    return acked


def _ingest_client(config: RunConfig, sampler_id: int, buffer: str, security: Security) -> IngestClient:
    """This sampler's connection to the buffer's ingest service (its pushes' idempotency key)."""
    timeout = config.sampler.push_timeout_sec
    return IngestClient(
        buffer, sampler_id=sampler_id, run_id=config.run_id, push_timeout_sec=timeout, security=security
    )


def _harden(config: RunConfig, sampler_id: int, names: list[str]) -> None:
    """Pin and mlock this process (sampler.pin_cpus, sampler.mlock) and say what it got."""
    report = harden(sampler_id, pin=config.sampler.pin_cpus, mlock=config.sampler.mlock)
    log.info("sampler %d: task %s, cpu %s, mlocked %s", sampler_id, ", ".join(names), report.cpu, report.mlocked)


def _collect(collector: Collector, stop: threading.Event) -> int:
    """The collector's episodes until `stop`; its pusher closed after, whatever the buffer does."""
    try:
        return collector.run(stop)
    finally:
        collector.pusher.close(timeout=3.0)


class Collector:
    """act -> relabel -> enqueue, one episode per step(), until stopped: the sampler's loop, built
    complete here (its random streams, exploring policy, task picker and schedule).

        collector = Collector(config, sampler_id, envs, mine, agg, watcher, pusher, heartbeat)
        env_steps = collector.run(stop)       # step() after step() until `stop` is set

    `envs[i]` acts for the run's task place `mine[i]`; env steps follow the learner's task shares
    (TaskSchedule, through `agg`) when this sampler has more than one task.
    """

    def __init__(
        self,
        config: RunConfig,
        sampler_id: int,
        envs: list,
        mine: list[int],
        agg: AggregatorClient,
        watcher: WeightsWatcher,
        pusher: Pusher,
        heartbeat: Heartbeat,
    ) -> None:
        self.config, self.cfg, self.tasks = config, config.sampler, TaskSet.for_run(config)
        self.envs, self.mine = envs, mine
        self.watcher, self.pusher, self.heartbeat = watcher, pusher, heartbeat
        self.sampler_id = sampler_id
        self.env_steps = self.episodes = self.successes = 0
        self.demo_env_steps = self.demo_successes = 0  # demonstrations: not the random warm-up's steps
        # Streams of this sampler *process*: a restarted sampler (a new incarnation) must not
        # replay its previous life's episodes, and samplers never share episode seeds.
        streams = np.random.SeedSequence([self.cfg.seed, sampler_id, pusher.incarnation]).spawn(3)
        self.rng, self.seeds = np.random.default_rng(streams[0]), np.random.default_rng(streams[1])
        self.policy = Policy.exploring(config, seed=int(streams[2].generate_state(1)[0]))
        self.picker = TaskPicker(len(mine))
        self.schedule: TaskSchedule | None = None
        if len(mine) > 1:  # env steps follow the learner's shares
            shares = functools.partial(_my_shares, self.picker, mine)
            self.schedule = TaskSchedule.for_run(config, self.tasks.names, agg, shares)

    def run(self, stop: threading.Event) -> int:
        """This sampler's demonstrations, then episodes until `stop` is set; returns the env steps taken."""
        if self.cfg.demo_episodes:
            self.demonstrate(stop)
        while not stop.is_set():
            self.step()
        return self.env_steps

    def demonstrate(self, stop: threading.Event) -> int:
        """This sampler's share of the run's demonstrations (sampler/demos.py) but those the buffer
        already holds (an earlier life of this sampler stored them), each pushed as one marked
        batch; returns how many of its share are stored or queued."""
        plan = demo_plan(self.config, len(self.tasks), self.sampler_id, self.cfg.num_samplers)
        done = stored_demonstrations(self.pusher, self.sampler_id, stop) if plan else 0
        with demo_envs(self.config, self.tasks, plan[done:], dict(zip(self.mine, self.envs, strict=True))) as envs:
            for demo in plan[done:]:
                if stop.is_set():
                    break
                spec, env = self.tasks.tasks[demo.place], envs[demo.place]
                with self.heartbeat.phase("demonstrate"):
                    episode, success = demonstrate(env, spec, demo, self.rng)
                    transitions = episode_rows(self.config, env, episode, self.rng)
                self.pusher.put(
                    transitions,
                    0,
                    env_steps=len(episode),
                    task_id=spec.task_id,
                    demonstration=True,
                    on_held=self.held_back,
                )
                self.env_steps += len(episode)
                self.demo_env_steps += len(episode)
                self.demo_successes += success
                done += 1
                self.heartbeat.beat(
                    env_steps=self.env_steps, demo_episodes=done, demo_successes=self.demo_successes,
                    acked_env_steps=self.pusher.acked_env_steps,
                )  # fmt: skip
        log.info("sampler %d: %d of its %d demonstrations stored or queued", self.sampler_id, done, len(plan))
        return done

    def step(self) -> int:
        """One episode: newest weights, a rollout of the task furthest behind its share, HER
        relabeling, then the pusher's queue (which waits while flow control holds pushes back).
        Returns its env steps."""
        self.policy.refresh(self.watcher.latest())
        if self.schedule is not None:
            self.schedule.refresh()
        policy = self.policy
        warm = self.env_steps - self.demo_env_steps >= self.cfg.random_steps
        acting = policy if (warm and policy.actor is not None) else None
        turn = self.picker.pick()
        env, place = self.envs[turn], self.mine[turn]
        with self.heartbeat.phase("rollout"):
            seed = int(self.seeds.integers(TRAIN_SEEDS_FROM, 2**31))  # clear of the evaluator's held-out seeds
            episode, success = rollout(env, acting, seed=seed, rng=self.rng, task=place)
        with self.heartbeat.phase("relabel"):
            transitions = episode_rows(self.config, env, episode, self.rng)
        with self.heartbeat.phase("enqueue"):  # long only while flow control holds pushes back
            task_id = self.tasks.tasks[place].task_id
            self.pusher.put(
                transitions,
                max(policy.version, 0),
                env_steps=len(episode),
                successes=int(success),
                task_id=task_id,
                on_held=self.held_back,
            )
        self.picker.record(turn, len(episode))
        self.env_steps += len(episode)
        self.episodes += 1
        self.successes += success
        self.heartbeat.beat(
            env_steps=self.env_steps,
            episodes=self.episodes,
            train_success=self.successes / self.episodes,
            acked_env_steps=self.pusher.acked_env_steps,
            version=policy.version,
            rate_limited_sec=self.pusher.rate_limited_sec,
        )
        return len(episode)

    def held_back(self) -> None:
        """A beat while put() waits on flow control (Pusher.put's `on_held`)."""
        self.heartbeat.beat(rate_limited_sec=self.pusher.rate_limited_sec)


def episode_rows(config: RunConfig, env, episode: Episode, rng: np.random.Generator) -> Transitions:
    """What one episode stores: its rows and sampler.her_k HER copies under sim.reward "sparse";
    under "shaped", its rows once with the env's own rewards (no goal can be relabeled)."""
    n_step, gamma = config.learner.n_step, config.learner.gamma
    if config.sim.reward == "shaped":
        return own_reward_rows(episode, n_step, gamma)
    reward = functools.partial(goal_reward, env)
    cfg = config.sampler
    return relabel_future(episode, cfg.her_k, reward, rng, cfg.her_k_unmoved, n_step, gamma)


def stored_demonstrations(pusher: Pusher, sampler_id: int, stop: threading.Event) -> int:
    """How many of sampler `sampler_id`'s demonstrations the run's buffer holds (the run counts
    them per sampler, restarts and resumed runs included); waits for an ingest service that is
    not up yet (any other refusal is raised), and says 0 once `stop` is set."""
    while not stop.is_set():
        try:
            stats = pusher.ingest.stats(wait_for_ready=True, timeout_sec=5.0)
            return int(stats.demo_episodes_by_sampler.get(sampler_id, 0))
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            if code is None or code not in IngestClient.RETRYABLE:
                raise
            log.info("sampler %d: buffer not answering yet (%s); its demonstrations wait", sampler_id, code.name)
            stop.wait(1.0)
    return 0


def _my_shares(picker: TaskPicker, mine: list[int], shares: np.ndarray) -> None:
    picker.set_shares(shares[mine])
