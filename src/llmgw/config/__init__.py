"""Configuration: pydantic models for the config files, loading and validation errors.

Every error raised here names the file, the field and what is wrong, so that an
operator can fix a config without reading a traceback.
"""

from llmgw.config.errors import ConfigError
from llmgw.config.loading import load_server_config, parse_endpoint_flag, parse_listen
from llmgw.config.models import ModelConfig, ProfileConfig
from llmgw.config.server import (
    AgentTLSConfig,
    AuthConfig,
    ControlConfig,
    EndpointConfig,
    HealthConfig,
    HttpServerConfig,
    LimitsConfig,
    ListenAddress,
    RouterConfig,
    ServerConfig,
    TimeoutsConfig,
    UsageConfig,
)
from llmgw.config.telemetry import TelemetryConfig

__all__ = [
    "AgentTLSConfig",
    "AuthConfig",
    "ConfigError",
    "ControlConfig",
    "EndpointConfig",
    "HealthConfig",
    "HttpServerConfig",
    "LimitsConfig",
    "ListenAddress",
    "ModelConfig",
    "ProfileConfig",
    "RouterConfig",
    "ServerConfig",
    "TelemetryConfig",
    "TimeoutsConfig",
    "UsageConfig",
    "load_server_config",
    "parse_endpoint_flag",
    "parse_listen",
]
