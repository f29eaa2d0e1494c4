"""`speculators-hybrid accept TARGET HELDOUT.jsonl --drafter DIR`: what a trained drafter is worth.

Serves the target twice with vLLM, each engine in its own process: alone, then with the drafter
(`--no-baseline` skips the first), both greedy on the same held-out chats (speculators'
`conversations` jsonl, chats the drafter was not trained on), and reports what speculators' own
end-to-end tests read from vLLM's counters: acceptance per draft position and acceptance length
at `--k` draft tokens, and decode tokens/s with all prompts at once and one at a time, the
drafter's against the target's alone, measured side by side on this machine. The method comes
from the drafter's `config.json` (`speculators_model_type`) unless `--method` names it.
Writes `target.json`, `drafter.json`, their engine logs and `report.json` into `--out`.
Run it where the target is served (vLLM and this project installed, a GPU) and with no
extraction server holding the GPU.
Exit status: 0 measured, 1 an engine failed (its error and log are named), 2 bad input.
"""
