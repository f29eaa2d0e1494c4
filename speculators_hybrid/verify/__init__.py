"""`speculators-hybrid verify PATH... --model MODEL_DIR`: recompute a sample with the model.

`check` finds what is visibly broken; verify finds what looks healthy but is wrong (a layer off
by one, rows of another request, a prefix-cache hit computed from the wrong state, a state taken
after the final norm). For a seeded random sample of the files (`--sample N`, default 32, or
`--fraction F`; `--seed S`), transformers runs the model on each file's `token_ids` and the
hidden states are compared per token and per layer id. Ids: `--ids`, else the file's
provenance metadata (`layer_ids`), else speculators' default [2, n//2, n-3, n]; a file whose
shape disagrees with them or with the model's config fails, it is not guessed at. Id 0 is the
embeddings' output, id i the output of decoder layer i-1 before the final norm.

Rule, per id: the truth is a float32 forward; the floor is the model's own forward in the dtype
the server ran in (`--dtype`, default each file's dtype, bf16 for vLLM's files) against the
truth. With s = 1 - |a - b|^2 / (2 |a| |b|) (the cosine when the norms agree, lower when they
do not) and e = 1 - s at the worst token, a file passes when

    e_file <= 3 * e_floor + 1e-4     for every id

(k = 3, eps = 1e-4: docs/verify.md and speculators_hybrid/verify/rule.py say why). Files of
hs-connectors' fp8 backend (float8 values, `hidden_states_scales` per token) are read as the
trainer reads them (values x scales, in bf16), and their floor is that low-precision forward
stored as fp8 and read back the same way: quantisation measured on the file's own tokens. Each
file's line and JSON say which backend's format it is in (`file` or `fp8`).
Exit status: 0 every verified file passes, 1 some failed (each is named with why), 2 bad input.
Needs `pip install './speculators-hybrid[verify]'` (the clone's folder); `--device cuda` for a
27B-class model.
"""
