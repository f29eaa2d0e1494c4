"""Double of speculators' scripts/launch_vllm.py, release 0.5.0 (see generation.py)."""

from generation import main

if __name__ == "__main__":
    main("0.5.0")
