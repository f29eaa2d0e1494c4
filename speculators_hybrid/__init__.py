"""speculators-hybrid: hidden-state extraction for drafter training on hybrid models in vLLM.

Importing the package patches nothing; vLLM's plugin loader calls `plugin.register()`.
"""

__version__ = "0.1.0"
