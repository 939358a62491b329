"""pytest fixtures for capture code, for a project that runs with ``-p no:cgguard``.

The cgguard pytest plugin, registered when cgguard is installed, already provides them; load
this module with ``pytest_plugins = ["cgguard.testing.fixtures"]`` only where the plugin is off.
"""

from cgguard.pytest_plugin import simulated_cuda_runtime

__all__ = ["simulated_cuda_runtime"]
