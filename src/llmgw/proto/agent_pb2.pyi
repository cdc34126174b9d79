from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_STATE_UNSPECIFIED: _ClassVar[ShardState]
    SHARD_STATE_STARTING: _ClassVar[ShardState]
    SHARD_STATE_LOADING: _ClassVar[ShardState]
    SHARD_STATE_READY: _ClassVar[ShardState]
    SHARD_STATE_DRAINING: _ClassVar[ShardState]
    SHARD_STATE_STOPPED: _ClassVar[ShardState]
    SHARD_STATE_FAILED: _ClassVar[ShardState]
    SHARD_STATE_SLEEPING: _ClassVar[ShardState]
SHARD_STATE_UNSPECIFIED: ShardState
SHARD_STATE_STARTING: ShardState
SHARD_STATE_LOADING: ShardState
SHARD_STATE_READY: ShardState
SHARD_STATE_DRAINING: ShardState
SHARD_STATE_STOPPED: ShardState
SHARD_STATE_FAILED: ShardState
SHARD_STATE_SLEEPING: ShardState

class JoinRequest(_message.Message):
    __slots__ = ("token", "node_id", "csr_pem")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    token: str
    node_id: str
    csr_pem: bytes
    def __init__(self, token: _Optional[str] = ..., node_id: _Optional[str] = ..., csr_pem: _Optional[bytes] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem", "node_id", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_pem: bytes
    node_id: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., node_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    def __init__(self, csr_pem: _Optional[bytes] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: bytes
    ca_pem: bytes
    def __init__(self, certificate_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "shard_status", "command_result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    shard_status: ShardStatus
    command_result: CommandResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shard_status: _Optional[_Union[ShardStatus, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_total_bytes", "memory_free_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ...) -> None: ...

class Hardware(_message.Message):
    __slots__ = ("gpus", "cpu_count", "memory_total_bytes", "weights_disk_free_bytes", "gpu_source")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_SOURCE_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    cpu_count: int
    memory_total_bytes: int
    weights_disk_free_bytes: int
    gpu_source: str
    def __init__(self, gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., cpu_count: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., weights_disk_free_bytes: _Optional[int] = ..., gpu_source: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "hostname", "agent_version", "hardware", "labels", "fabric", "running_shards", "port_range_start", "port_range_end", "weights_dir", "advertise_host", "interfaces", "weights_max_use_fraction", "weights_max_use_bytes", "sleep_memory_max_bytes", "follows_heartbeat_interval")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FabricEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SHARDS_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_START_FIELD_NUMBER: _ClassVar[int]
    PORT_RANGE_END_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_DIR_FIELD_NUMBER: _ClassVar[int]
    ADVERTISE_HOST_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_MAX_USE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_MAX_USE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLEEP_MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLLOWS_HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    agent_version: str
    hardware: Hardware
    labels: _containers.ScalarMap[str, str]
    fabric: _containers.ScalarMap[str, str]
    running_shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    port_range_start: int
    port_range_end: int
    weights_dir: str
    advertise_host: str
    interfaces: _containers.RepeatedCompositeFieldContainer[NetworkInterface]
    weights_max_use_fraction: float
    weights_max_use_bytes: int
    sleep_memory_max_bytes: int
    follows_heartbeat_interval: bool
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., hardware: _Optional[_Union[Hardware, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., fabric: _Optional[_Mapping[str, str]] = ..., running_shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., port_range_start: _Optional[int] = ..., port_range_end: _Optional[int] = ..., weights_dir: _Optional[str] = ..., advertise_host: _Optional[str] = ..., interfaces: _Optional[_Iterable[_Union[NetworkInterface, _Mapping]]] = ..., weights_max_use_fraction: _Optional[float] = ..., weights_max_use_bytes: _Optional[int] = ..., sleep_memory_max_bytes: _Optional[int] = ..., follows_heartbeat_interval: _Optional[bool] = ...) -> None: ...

class NetworkInterface(_message.Message):
    __slots__ = ("name", "addresses")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    name: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class GpuUsage(_message.Message):
    __slots__ = ("index", "utilization_percent", "memory_used_bytes", "memory_free_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization_percent: float
    memory_used_bytes: int
    memory_free_bytes: int
    def __init__(self, index: _Optional[int] = ..., utilization_percent: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("gpus", "sequence", "weights", "disk_total_bytes", "disk_free_bytes", "memory_total_bytes", "memory_available_bytes", "downloads")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DOWNLOADS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuUsage]
    sequence: int
    weights: _containers.RepeatedCompositeFieldContainer[HeldWeights]
    disk_total_bytes: int
    disk_free_bytes: int
    memory_total_bytes: int
    memory_available_bytes: int
    downloads: _containers.RepeatedCompositeFieldContainer[WeightsDownload]
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuUsage, _Mapping]]] = ..., sequence: _Optional[int] = ..., weights: _Optional[_Iterable[_Union[HeldWeights, _Mapping]]] = ..., disk_total_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., downloads: _Optional[_Iterable[_Union[WeightsDownload, _Mapping]]] = ...) -> None: ...

class WeightsDownload(_message.Message):
    __slots__ = ("repo", "revision", "done_bytes", "total_bytes", "rate_bytes_per_second", "error")
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RATE_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revision: str
    done_bytes: int
    total_bytes: int
    rate_bytes_per_second: float
    error: str
    def __init__(self, repo: _Optional[str] = ..., revision: _Optional[str] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., rate_bytes_per_second: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class HeldWeights(_message.Message):
    __slots__ = ("repo", "revision", "bytes", "last_used_unix")
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revision: str
    bytes: int
    last_used_unix: float
    def __init__(self, repo: _Optional[str] = ..., revision: _Optional[str] = ..., bytes: _Optional[int] = ..., last_used_unix: _Optional[float] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard_id", "model", "state", "message", "pid", "endpoint_url", "output_tail", "exit_code", "spec", "since_unix", "download", "adapters")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_URL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    DOWNLOAD_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    model: str
    state: ShardState
    message: str
    pid: int
    endpoint_url: str
    output_tail: _containers.RepeatedScalarFieldContainer[str]
    exit_code: int
    spec: ShardSpec
    since_unix: float
    download: Download
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shard_id: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[_Union[ShardState, str]] = ..., message: _Optional[str] = ..., pid: _Optional[int] = ..., endpoint_url: _Optional[str] = ..., output_tail: _Optional[_Iterable[str]] = ..., exit_code: _Optional[int] = ..., spec: _Optional[_Union[ShardSpec, _Mapping]] = ..., since_unix: _Optional[float] = ..., download: _Optional[_Union[Download, _Mapping]] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class Download(_message.Message):
    __slots__ = ("repo", "revision", "done", "total", "rate", "files", "started_unix")
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revision: str
    done: int
    total: int
    rate: float
    files: _containers.RepeatedScalarFieldContainer[str]
    started_unix: float
    def __init__(self, repo: _Optional[str] = ..., revision: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., rate: _Optional[float] = ..., files: _Optional[_Iterable[str]] = ..., started_unix: _Optional[float] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "error")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ok: bool
    error: str
    def __init__(self, command_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("registered", "start_shard", "stop_shard", "drain_shard", "remove_weights", "sleep_shard", "wake_shard", "pull_weights", "load_adapter", "unload_adapter", "heartbeat_interval", "command_id")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    START_SHARD_FIELD_NUMBER: _ClassVar[int]
    STOP_SHARD_FIELD_NUMBER: _ClassVar[int]
    DRAIN_SHARD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SLEEP_SHARD_FIELD_NUMBER: _ClassVar[int]
    WAKE_SHARD_FIELD_NUMBER: _ClassVar[int]
    PULL_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    UNLOAD_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    start_shard: StartShard
    stop_shard: StopShard
    drain_shard: DrainShard
    remove_weights: RemoveWeights
    sleep_shard: SleepShard
    wake_shard: WakeShard
    pull_weights: PullWeights
    load_adapter: LoadAdapter
    unload_adapter: UnloadAdapter
    heartbeat_interval: HeartbeatInterval
    command_id: str
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., start_shard: _Optional[_Union[StartShard, _Mapping]] = ..., stop_shard: _Optional[_Union[StopShard, _Mapping]] = ..., drain_shard: _Optional[_Union[DrainShard, _Mapping]] = ..., remove_weights: _Optional[_Union[RemoveWeights, _Mapping]] = ..., sleep_shard: _Optional[_Union[SleepShard, _Mapping]] = ..., wake_shard: _Optional[_Union[WakeShard, _Mapping]] = ..., pull_weights: _Optional[_Union[PullWeights, _Mapping]] = ..., load_adapter: _Optional[_Union[LoadAdapter, _Mapping]] = ..., unload_adapter: _Optional[_Union[UnloadAdapter, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[HeartbeatInterval, _Mapping]] = ..., command_id: _Optional[str] = ...) -> None: ...

class HeartbeatInterval(_message.Message):
    __slots__ = ("seconds",)
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    def __init__(self, seconds: _Optional[float] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("heartbeat_interval_seconds", "leader_id", "server_version")
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    leader_id: str
    server_version: str
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ..., leader_id: _Optional[str] = ..., server_version: _Optional[str] = ...) -> None: ...

class ShardSpec(_message.Message):
    __slots__ = ("shard_id", "model", "engine", "weights", "gpu_indices", "port", "engine_args", "env", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "load_timeout_seconds", "unhealthy_after_seconds", "drain_grace_seconds", "nodes", "node_rank", "master_addr", "master_port", "replica_id", "sleep_mode")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SLEEP_MODE_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    model: str
    engine: str
    weights: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    port: int
    engine_args: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    load_timeout_seconds: float
    unhealthy_after_seconds: float
    drain_grace_seconds: float
    nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    replica_id: str
    sleep_mode: bool
    def __init__(self, shard_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., weights: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., port: _Optional[int] = ..., engine_args: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ..., gpu_memory_utilization: _Optional[float] = ..., load_timeout_seconds: _Optional[float] = ..., unhealthy_after_seconds: _Optional[float] = ..., drain_grace_seconds: _Optional[float] = ..., nodes: _Optional[int] = ..., node_rank: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., replica_id: _Optional[str] = ..., sleep_mode: _Optional[bool] = ...) -> None: ...

class StartShard(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: ShardSpec
    def __init__(self, spec: _Optional[_Union[ShardSpec, _Mapping]] = ...) -> None: ...

class StopShard(_message.Message):
    __slots__ = ("shard_id", "grace_seconds")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    grace_seconds: float
    def __init__(self, shard_id: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class DrainShard(_message.Message):
    __slots__ = ("shard_id", "grace_seconds")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    grace_seconds: float
    def __init__(self, shard_id: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class SleepShard(_message.Message):
    __slots__ = ("shard_id", "level")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    level: int
    def __init__(self, shard_id: _Optional[str] = ..., level: _Optional[int] = ...) -> None: ...

class WakeShard(_message.Message):
    __slots__ = ("shard_id",)
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    def __init__(self, shard_id: _Optional[str] = ...) -> None: ...

class LoadAdapter(_message.Message):
    __slots__ = ("shard_id", "name", "path")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    name: str
    path: str
    def __init__(self, shard_id: _Optional[str] = ..., name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class UnloadAdapter(_message.Message):
    __slots__ = ("shard_id", "name")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    name: str
    def __init__(self, shard_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class RemoveWeights(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class PullWeights(_message.Message):
    __slots__ = ("repo", "revision")
    REPO_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    repo: str
    revision: str
    def __init__(self, repo: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...
