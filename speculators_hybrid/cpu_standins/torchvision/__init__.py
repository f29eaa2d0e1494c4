"""Inert stand-in for torchvision, put on the path only by `speculators_hybrid.cpu.prepare()`.

Lives on disk so that subprocesses vLLM starts (model inspection) see it too.
"""

from speculators_hybrid.cpu import inert_attribute, install_inert_finder

__version__ = "0.0"
install_inert_finder()


def __getattr__(attr: str):
    return inert_attribute("torchvision", attr)
