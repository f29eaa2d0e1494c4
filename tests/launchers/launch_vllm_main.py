"""Double of speculators' scripts/launch_vllm.py, release main (see generation.py)."""

from generation import main

if __name__ == "__main__":
    main("main")
