from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TransitionBatch(_message.Message):
    __slots__ = ("run_id", "sampler_id", "seq", "policy_version", "task_id", "num_transitions", "columns", "env_steps", "episodes", "successes", "incarnation", "demonstration")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DEMONSTRATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    sampler_id: int
    seq: int
    policy_version: int
    task_id: int
    num_transitions: int
    columns: _containers.RepeatedCompositeFieldContainer[Tensor]
    env_steps: int
    episodes: int
    successes: int
    incarnation: int
    demonstration: bool
    def __init__(self, run_id: _Optional[str] = ..., sampler_id: _Optional[int] = ..., seq: _Optional[int] = ..., policy_version: _Optional[int] = ..., task_id: _Optional[int] = ..., num_transitions: _Optional[int] = ..., columns: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., env_steps: _Optional[int] = ..., episodes: _Optional[int] = ..., successes: _Optional[int] = ..., incarnation: _Optional[int] = ..., demonstration: _Optional[bool] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("seq", "stored", "duplicate", "head")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    stored: int
    duplicate: bool
    head: int
    def __init__(self, seq: _Optional[int] = ..., stored: _Optional[int] = ..., duplicate: _Optional[bool] = ..., head: _Optional[int] = ...) -> None: ...

class BufferStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BufferStats(_message.Message):
    __slots__ = ("head", "env_steps", "batches", "rejected", "duplicates", "oldest_window", "newest_window", "episodes", "train_success", "env_steps_by_task", "demo_episodes_by_sampler")
    class EnvStepsByTaskEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class DemoEpisodesBySamplerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    HEAD_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    NEWEST_WINDOW_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_BY_TASK_FIELD_NUMBER: _ClassVar[int]
    DEMO_EPISODES_BY_SAMPLER_FIELD_NUMBER: _ClassVar[int]
    head: int
    env_steps: int
    batches: int
    rejected: int
    duplicates: int
    oldest_window: int
    newest_window: int
    episodes: int
    train_success: float
    env_steps_by_task: _containers.ScalarMap[int, int]
    demo_episodes_by_sampler: _containers.ScalarMap[int, int]
    def __init__(self, head: _Optional[int] = ..., env_steps: _Optional[int] = ..., batches: _Optional[int] = ..., rejected: _Optional[int] = ..., duplicates: _Optional[int] = ..., oldest_window: _Optional[int] = ..., newest_window: _Optional[int] = ..., episodes: _Optional[int] = ..., train_success: _Optional[float] = ..., env_steps_by_task: _Optional[_Mapping[int, int]] = ..., demo_episodes_by_sampler: _Optional[_Mapping[int, int]] = ...) -> None: ...

class Gradients(_message.Message):
    __slots__ = ("learner_id", "base_version", "tensors", "metrics", "batch_size", "incarnation", "seq", "shared")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    learner_id: int
    base_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    metrics: _containers.ScalarMap[str, float]
    batch_size: int
    incarnation: int
    seq: int
    shared: SharedSegment
    def __init__(self, learner_id: _Optional[int] = ..., base_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., batch_size: _Optional[int] = ..., incarnation: _Optional[int] = ..., seq: _Optional[int] = ..., shared: _Optional[_Union[SharedSegment, _Mapping]] = ...) -> None: ...

class GradientAck(_message.Message):
    __slots__ = ("applied", "version", "reason", "duplicate")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    version: int
    reason: str
    duplicate: bool
    def __init__(self, applied: _Optional[bool] = ..., version: _Optional[int] = ..., reason: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("subscriber", "after_version", "groups", "min_interval_sec", "shared_memory", "shared_memory_key")
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_SEC_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_KEY_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    after_version: int
    groups: _containers.RepeatedScalarFieldContainer[str]
    min_interval_sec: float
    shared_memory: bool
    shared_memory_key: int
    def __init__(self, subscriber: _Optional[str] = ..., after_version: _Optional[int] = ..., groups: _Optional[_Iterable[str]] = ..., min_interval_sec: _Optional[float] = ..., shared_memory: _Optional[bool] = ..., shared_memory_key: _Optional[int] = ...) -> None: ...

class Weights(_message.Message):
    __slots__ = ("version", "tensors", "layout", "shared")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    layout: str
    shared: SharedSegment
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., layout: _Optional[str] = ..., shared: _Optional[_Union[SharedSegment, _Mapping]] = ...) -> None: ...

class SharedSegment(_message.Message):
    __slots__ = ("path", "key")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    path: str
    key: int
    def __init__(self, path: _Optional[str] = ..., key: _Optional[int] = ...) -> None: ...

class AggregatorStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AggregatorStats(_message.Message):
    __slots__ = ("version", "gradients_applied", "gradients_stale", "gradients_rejected", "subscribers", "last_eval", "env_steps", "last_curve", "last_full", "rejected_by_learner", "steps_skipped", "gradients_clipped", "gradients_duplicate")
    class RejectedByLearnerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_STALE_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_EVAL_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    LAST_CURVE_FIELD_NUMBER: _ClassVar[int]
    LAST_FULL_FIELD_NUMBER: _ClassVar[int]
    REJECTED_BY_LEARNER_FIELD_NUMBER: _ClassVar[int]
    STEPS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_CLIPPED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    version: int
    gradients_applied: int
    gradients_stale: int
    gradients_rejected: int
    subscribers: int
    last_eval: EvalReport
    env_steps: int
    last_curve: EvalReport
    last_full: EvalReport
    rejected_by_learner: _containers.ScalarMap[str, int]
    steps_skipped: int
    gradients_clipped: int
    gradients_duplicate: int
    def __init__(self, version: _Optional[int] = ..., gradients_applied: _Optional[int] = ..., gradients_stale: _Optional[int] = ..., gradients_rejected: _Optional[int] = ..., subscribers: _Optional[int] = ..., last_eval: _Optional[_Union[EvalReport, _Mapping]] = ..., env_steps: _Optional[int] = ..., last_curve: _Optional[_Union[EvalReport, _Mapping]] = ..., last_full: _Optional[_Union[EvalReport, _Mapping]] = ..., rejected_by_learner: _Optional[_Mapping[str, int]] = ..., steps_skipped: _Optional[int] = ..., gradients_clipped: _Optional[int] = ..., gradients_duplicate: _Optional[int] = ...) -> None: ...

class EvalAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EvalReport(_message.Message):
    __slots__ = ("version", "episodes", "success_rate", "mean_return", "env_steps", "wall_sec", "evaluator", "kind", "task_success", "actor")
    class TaskSuccessEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    WALL_SEC_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TASK_SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    version: int
    episodes: int
    success_rate: float
    mean_return: float
    env_steps: int
    wall_sec: float
    evaluator: str
    kind: str
    task_success: _containers.ScalarMap[str, float]
    actor: Tensor
    def __init__(self, version: _Optional[int] = ..., episodes: _Optional[int] = ..., success_rate: _Optional[float] = ..., mean_return: _Optional[float] = ..., env_steps: _Optional[int] = ..., wall_sec: _Optional[float] = ..., evaluator: _Optional[str] = ..., kind: _Optional[str] = ..., task_success: _Optional[_Mapping[str, float]] = ..., actor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
