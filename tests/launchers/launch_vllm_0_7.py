"""Double of speculators' scripts/launch_vllm.py, release 0.7.x (see generation.py)."""

from generation import main

if __name__ == "__main__":
    main("0.7.x")
