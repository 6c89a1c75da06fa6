"""The evaluator role: a sampler in evaluation mode that scores weight versions.

    while running:
        snapshot = watcher.wait_newer_than(last_scored)       # after an adaptive interval
        curve = deterministic episodes on held-out seeds eval.seed + 0 .. curve_episodes - 1
        aggregator.ReportEval(version, curve, kind="curve")   # the learning curve: fixed budget
        full  = the same episodes continued to eval.episodes while the target is within reach
        aggregator.ReportEval(version, full, kind="full")     # only a complete full score reaches it

Every version is scored on the same held-out seeds, so two versions' rates are comparable,
and each task as eval.measure says (sim/measure.py: Meta-World's any-step success over 500 steps).
A multi-task run scores every task on the same budget: its success rate is the mean over the
tasks (each task's rate travels beside it, `task_success`), and a score's `episodes` is per task.
`score_checkpoint` scores a saved policy the same way (`fleetrl evaluate`, and the final
score the launcher runs when a run ends short of its target).
Far from the target the evaluator scores rarely (a fraction of the run's age between scores,
see `next_interval_sec`); near it, every `min_interval_sec`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import numpy as np

from aggregator.client import AggregatorClient
from buffer.ingest_client import IngestClient
from foundation.acting import Policy, rollout
from foundation.checkpoint import load_policy_checkpoint, resolve_checkpoint
from foundation.config import EvalConfig, RunConfig
from foundation.policy import ACTOR_GROUPS, SWA_GROUP
from foundation.process import Heartbeat
from foundation.proto import fleetrl_pb2 as pb
from foundation.transport import Security
from foundation.wire import to_tensor
from sim.measure import eval_env
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.evaluator")


@dataclass(frozen=True)
class EvalResult:
    success_rate: float
    mean_return: float
    episodes: int  # per task, in a multi-task run
    task_success: dict[str, float] = field(default_factory=dict)  # multi-task runs: per task name

    @classmethod
    def mean_of(cls, per_task: dict[str, EvalResult]) -> EvalResult:
        """A multi-task score: the mean rate and return over tasks, the fewest episodes of any."""
        if len(per_task) == 1:
            return next(iter(per_task.values()))
        results = list(per_task.values())
        return cls(
            float(np.mean([r.success_rate for r in results])),
            float(np.mean([r.mean_return for r in results])),
            min(r.episodes for r in results),
            {name: r.success_rate for name, r in per_task.items()},
        )


@dataclass
class EpisodeLog:
    """Outcomes of one version's evaluation episodes so far (seed config.seed + index)."""

    successes: list[bool] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)

    def result(self) -> EvalResult:
        if not self.successes:
            return EvalResult(0.0, 0.0, 0)
        return EvalResult(float(np.mean(self.successes)), float(np.mean(self.returns)), len(self.successes))


def evaluate(
    env,
    policy: Policy,
    config: EvalConfig,
    stop_below: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    until: int | None = None,
    episodes: EpisodeLog | None = None,
    task: int = 0,
    give_up: Callable[[], bool] | None = None,
) -> EvalResult:
    """Deterministic episodes of the run's task place `task` on seeds config.seed + i,
    continuing `episodes` up to `until` (default: config.episodes).

    With `stop_below`, scoring ends as soon as a full score of config.episodes can no longer
    reach that success rate (or once `give_up()` says so); the result then covers fewer
    episodes. Early in training this cuts a full score to a few episodes, and it never hides a
    version that would have reached the target (measured: ~4.4 s per 20-episode score on a
    busy 2-core host).
    """
    done = episodes if episodes is not None else EpisodeLog()
    until = config.episodes if until is None else until
    rng = np.random.default_rng(config.seed + len(done.successes))
    while len(done.successes) < until:
        if should_stop():  # shutting down: an unfinished score is dropped by the caller
            break
        if stop_below is not None and _best_possible(done, config.episodes) < stop_below:
            break
        if give_up is not None and give_up():
            break
        seed = config.seed + len(done.successes)
        episode, success = rollout(env, policy, seed=seed, rng=rng, deterministic=True, task=task)
        done.successes.append(success)
        done.returns.append(float(episode.reward.sum()))  # the env's own reward (sim.reward)
    return done.result()


def score_checkpoint(
    path: str | os.PathLike, config: RunConfig, episodes: int, weights: str = "live"
) -> tuple[int, EvalResult]:
    """(version, result) of a checkpoint's deterministic policy over `episodes` held-out
    episodes (seeds eval.seed + i, nominal task unless eval.randomize), never cut short; a
    multi-task run's every task. `path` is a ckpt_<version>.pt file or a folder of them (the
    newest); `weights`: "live", or a weight average it holds ("swa", "swa_plain")."""
    ckpt = load_policy_checkpoint(resolve_checkpoint(path), weights)  # checks groups, spec, and NaN or inf weights
    policy = Policy.fixed(ckpt.version, ckpt.actor, ckpt.obs_norm, ckpt.spec)
    tasks = TaskSet.parse(ckpt.task) if ckpt.task else TaskSet.for_run(config)
    envs = eval_envs(tasks, config)
    try:
        per_task = {
            name: evaluate(env, policy, config.eval, until=episodes, task=i)
            for i, (name, env) in enumerate(zip(tasks.names, envs, strict=True))
        }
        return policy.version, EvalResult.mean_of(per_task)
    finally:
        for env in envs:
            env.close()


def eval_envs(tasks: TaskSet, config: RunConfig) -> list:
    """One env per task of the run, scored by eval.measure (sim/measure.py): the nominal task
    unless eval.randomize."""
    randomization = config.sim.randomization if config.eval.randomize else None
    sim = config.sim
    return [
        eval_env(tasks, i, randomization, sim.control_hz, sim.reward, config.eval.measure) for i in range(len(tasks))
    ]


def _best_possible(done: EpisodeLog, budget: int) -> float:
    """The best full-score rate still reachable if every remaining episode succeeds."""
    return (budget - (len(done.successes) - sum(done.successes))) / budget


def next_interval_sec(
    config: EvalConfig,
    target: float,
    curve_success: float,
    run_age_sec: float,
    misses: int = 0,
    score_cpu_sec: float = 0.0,
) -> float:
    """Seconds until the next score: rare while success is far below the target, frequent near it.

    Far off (curve success below half the target) the wait grows with the run's age, so scoring
    costs about curve_time / (interval_run_fraction * age) of a core: a 30-minute FetchPush run
    then spends ~1% of a core on evaluation instead of the 20% a fixed 2 s interval cost.
    Near it the wait is min_interval_sec, doubled for each of the last `misses` scores in a row
    that set no new best curve success (NearTarget), up to near_max_interval_sec: a FetchPickAndPlace
    plateau at 0.7-0.8 was scored every 2-3 s for 40 minutes (12% of the machine).

    Whatever those rules say, the wait is at least score_cpu_sec * (1 / max_core_share - 1), the
    last score's CPU seconds: scoring then takes at most max_core_share of a core. A 4-task run
    whose mean success sits near the target but cannot reach it (a task at 0) was otherwise
    scored every 12-28 s, live and weight average, at least 7,000 env steps each time: the
    evaluator took 0.28 of a core over 45 minutes (0.34 in the last 18), 2.5x the sampler's CPU,
    on a 2-core machine whose learner was the bottleneck.
    """
    if curve_success >= 0.5 * target:
        near_max = min(config.max_interval_sec, max(config.min_interval_sec, config.near_max_interval_sec))
        wait = min(near_max, config.min_interval_sec * 2.0 ** min(misses, 30))
    else:
        wait = min(config.max_interval_sec, max(config.min_interval_sec, config.interval_run_fraction * run_age_sec))
    share = config.max_core_share
    return max(wait, score_cpu_sec * (1.0 / share - 1.0)) if share > 0 else wait


@dataclass
class NearTarget:
    """Scores in a row, near the target, that set no new best curve success (next_interval_sec's
    `misses`). A new best is progress worth checking at once; a score that falls back below half
    the target starts the count again."""

    best: float = -1.0
    misses: int = 0

    def update(self, curve_success: float, target: float) -> int:
        if curve_success < 0.5 * target:
            self.misses = 0
        elif curve_success > self.best:
            self.misses = 0
        else:
            self.misses += 1
        self.best = max(self.best, curve_success)
        return self.misses


def _acked_env_steps(ingest: IngestClient, stop: threading.Event) -> int | None:
    """Env steps the buffer has acked; waits while the buffer service is (re)starting.
    None once `stop` is set."""
    while not stop.is_set():
        try:
            return ingest.stats(wait_for_ready=True, timeout_sec=1.0).env_steps  # short: re-check stop
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            stop.wait(0.5)
    return None


@dataclass(frozen=True)
class EvaluatorEndpoints:
    buffer: str  # host:port of a buffer ingest service (the run's acked env steps)
    aggregator: str  # host:port of the aggregator (weights in, scores out)


def run_evaluator(
    config: RunConfig,
    evaluator_id: int,
    endpoints: EvaluatorEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """The evaluator role (foundation/role.py): score versions until `stop` is set; returns how
    many versions were scored. Its envs are closed on the way out, on an error too."""
    os.nice(config.eval.nice)  # scoring uses spare CPU first; training loops keep priority
    tasks = TaskSet.for_run(config)
    envs = dict(zip(tasks.names, eval_envs(tasks, config), strict=True))
    try:
        return _score_versions(config, evaluator_id, endpoints, security, stop, heartbeat, envs)
    finally:
        for env in envs.values():
            env.close()


def _score_versions(
    config: RunConfig,
    evaluator_id: int,
    endpoints: EvaluatorEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
    envs: dict,
) -> int:
    policy, scored, name = Policy(), 0, f"evaluator-{evaluator_id}"
    # With aggregator.swa, the evaluator scores the weight average too, beside the live policy.
    watched = (*ACTOR_GROUPS, SWA_GROUP) if config.aggregator.swa != "off" else ACTOR_GROUPS
    with (
        # Short calls, retried: a hung aggregator must not keep the evaluator from its heartbeat.
        AggregatorClient(endpoints.aggregator, timeout_sec=5.0, security=security) as agg,
        # At most one version a second: the evaluator only needs the newest when it scores, and
        # every version streamed costs the aggregator a serialization (measured: 7% of a core).
        agg.watch(name, watched, min_interval_sec=1.0) as watcher,
        IngestClient(endpoints.buffer, sampler_id=0, run_id=config.run_id, security=security) as ingest,
    ):
        started, next_at, near = time.monotonic(), 0.0, NearTarget()
        while not stop.is_set():
            if time.monotonic() < next_at:  # waiting for the next score: keep the heartbeat alive
                with heartbeat.phase("idle"):
                    stop.wait(min(1.0, next_at - time.monotonic()))
                heartbeat.beat(scored=scored)
                continue
            snapshot = watcher.wait_newer_than(policy.version, timeout=0.5)
            if snapshot is None or stop.is_set():
                heartbeat.beat(scored=scored)
                continue
            env_steps = _acked_env_steps(ingest, stop)
            if env_steps is None:
                break
            policy.refresh(snapshot)
            cpu_at = time.process_time()  # the whole process: every thread that scoring keeps busy
            with heartbeat.phase("evaluate"):
                curve = _score_live_and_average(agg, envs, policy, snapshot, config, name, env_steps, stop, heartbeat)
            if curve is None:
                break
            scored += 1
            age = time.monotonic() - started
            misses = near.update(curve, config.target_success)
            cpu = time.process_time() - cpu_at
            wait = next_interval_sec(config.eval, config.target_success, curve, age, misses, cpu)
            next_at = time.monotonic() + wait
            heartbeat.beat(scored=scored, version=policy.version, success=curve)
    heartbeat.close(scored=scored)
    return scored


def _score_live_and_average(agg, envs, policy, snapshot, config, name, env_steps, stop, heartbeat) -> float | None:
    """The live policy's curve score, and with aggregator.swa the weight average's beside it (its
    own kind); None when the role stops or the aggregator is gone."""
    swa = config.aggregator.swa != "off"
    scored_actor = snapshot.tensors["actor"] if swa else None
    curve = _score(agg, envs, policy, config, name, env_steps, stop, heartbeat, scored_actor)
    if curve is not None and swa:
        tensors = snapshot.tensors
        average = Policy.fixed(snapshot.version, tensors[SWA_GROUP], tensors["obs_norm"], snapshot.spec)
        if _score(agg, envs, average, config, name, env_steps, stop, heartbeat, kinds=("swa_curve",)) is None:
            return None
    return curve


def scores(
    envs, policy: Policy, config: RunConfig, should_stop: Callable[[], bool] = lambda: False
) -> Iterator[tuple[str, EvalResult, float]]:
    """(kind, result, seconds): the curve score, then, while the target is within reach, the
    full score continuing the same episodes. Ends early (nothing more) once `should_stop`.

    `envs`: {task name: env} in the run's task order (or one env). Every task gets the same
    budget; a multi-task result is EvalResult.mean_of the tasks', and the full score gives up
    once the mean can no longer reach the target."""
    envs = envs if isinstance(envs, dict) else {"": envs}
    logs = {name: EpisodeLog() for name in envs}
    target = config.target_success if config.eval.stop_early else None

    def out_of_reach() -> bool:
        best = float(np.mean([_best_possible(log, config.eval.episodes) for log in logs.values()]))
        return target is not None and best < target

    for kind, until in (("curve", config.eval.curve_episodes), ("full", config.eval.episodes)):
        start = time.monotonic()
        for place, (name, env) in enumerate(envs.items()):
            cut = out_of_reach if kind == "full" else None  # a curve score is never cut short
            evaluate(env, policy, config.eval, None, should_stop, until, logs[name], task=place, give_up=cut)
            if should_stop():
                return
        result = EvalResult.mean_of({name: log.result() for name, log in logs.items()})
        if kind == "full" and max(len(log.successes) for log in logs.values()) <= config.eval.curve_episodes:
            return  # out of reach after the curve episodes (or no more to run): nothing new
        yield kind, result, time.monotonic() - start


def _score(
    agg,
    envs,
    policy: Policy,
    config: RunConfig,
    name: str,
    env_steps: int,
    stop,
    heartbeat: Heartbeat,
    scored_actor: np.ndarray | None = None,
    kinds: tuple[str, ...] = ("curve", "full"),
) -> float | None:
    """Curve score, then (while the target is within reach) the full score, each reported.
    Returns the curve success rate; None if asked to stop midway. `kinds=("swa_curve",)`
    scores the weight average on the curve budget only (reported as swa_curve); the live curve
    report carries `scored_actor` (the aggregator may admit it into the average)."""

    def should_stop() -> bool:  # asked between episodes: a long score keeps the heartbeat alive
        heartbeat.beat()
        return stop.is_set()

    curve: float | None = None
    for kind, result, sec in scores(envs, policy, config, should_stop):
        kind = "swa_curve" if kinds == ("swa_curve",) else kind
        report = pb.EvalReport(
            version=policy.version,
            episodes=result.episodes,
            success_rate=result.success_rate,
            mean_return=result.mean_return,
            env_steps=env_steps,
            wall_sec=sec,
            evaluator=name,
            kind=kind,
            task_success=result.task_success,
        )
        if kind == "curve" and scored_actor is not None:
            report.actor.CopyFrom(to_tensor("actor", scored_actor))
        try:
            agg.report_eval(report, should_stop=stop.is_set, on_wait=heartbeat.beat)
        except grpc.RpcError:
            if stop.is_set():
                return None  # stopping while the aggregator is away: the score is dropped
            raise
        log.info(
            "version %d: %s success %.2f over %d episodes", policy.version, kind, result.success_rate, result.episodes
        )
        curve = result.success_rate if curve is None else curve
        if "full" not in kinds:  # the curve budget only: never run the full score's episodes
            break
    return None if stop.is_set() else curve
