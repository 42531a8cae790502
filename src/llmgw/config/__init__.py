"""Reading server.yaml, agent.yaml and ctl.yaml into frozen values.

Every loader raises ``llmgw.errors.ConfigError`` whose message reads
``FILE:LINE: key.path: what is wrong and what to do``; see
docs/configuration.rst for every key.
"""

from __future__ import annotations

from llmgw.config.agent import AgentConfig, load_agent_config
from llmgw.config.catalog import Engine, Engines, Model, Profile
from llmgw.config.common import KNOWN_ENGINES
from llmgw.config.ctl import (
    CtlConfig,
    CtlSettings,
    CtlTLSFiles,
    default_ctl_config_path,
    load_ctl_config,
    resolve_ctl_settings,
)
from llmgw.config.endpoints import ServerEndpoint, parse_server_endpoint
from llmgw.config.routing import Admission, APIKey, RouterSettings
from llmgw.config.server import FleetSettings, Listen, ServerConfig, load_server_config
from llmgw.tlsfiles import TLSFiles

__all__ = [
    "KNOWN_ENGINES",
    "APIKey",
    "Admission",
    "AgentConfig",
    "CtlConfig",
    "CtlSettings",
    "CtlTLSFiles",
    "Engine",
    "Engines",
    "FleetSettings",
    "Listen",
    "Model",
    "Profile",
    "RouterSettings",
    "ServerConfig",
    "ServerEndpoint",
    "TLSFiles",
    "default_ctl_config_path",
    "load_agent_config",
    "load_ctl_config",
    "load_server_config",
    "parse_server_endpoint",
    "resolve_ctl_settings",
]
