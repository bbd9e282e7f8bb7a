"""The service desk: a tau2-bench-style customer-service task in miniature, as text commands
(`ServiceDeskEnv`) and as JSON tools (`ServiceDeskToolsEnv`)."""

from lit_asyncrl.envs.service_desk.task import ServiceDeskEnv
from lit_asyncrl.envs.service_desk.tools_task import ServiceDeskToolsEnv

__all__ = ["ServiceDeskEnv", "ServiceDeskToolsEnv"]
