#!/bin/bash
# The acceptance loop on the GPU machine, once vLLM, speculators and this project are staged
# (tests/gpu/speculators-deps.txt says how); benchmarks/acceptance/README.md gives the sequence.
#   bash benchmarks/acceptance/loop.sh start    # the whole loop, in the background
#   bash benchmarks/acceptance/loop.sh poll N   # wait up to N s, then copy what is done to $OUT
# start copies this folder and speculators' launcher to $ACC (default /tmp/stash/acc), so a later
# call replacing the working tree does not touch a running phase, and runs, each in its own
# process with a timeout, logging to $ACC/logs:
#   1. target.py: the stdlib-tiny target ($TARGET_S s of training);
#   2. `speculators-hybrid launch --launcher $LAUNCHER` (vLLM + plugin, prefill-only), then
#      speculators' prepare-data on $CHATS training chats, then EAGLE-3 and DFlash trained side
#      by side by `speculators train --on-missing generate` through `speculators-hybrid run`
#      ($STEPS steps, at most $EPOCHS epochs), and with ABLATE=1 (default) a third, the same
#      EAGLE-3 with the plugin's verifier-norm patch disabled (SPECULATORS_HYBRID_DISABLED_PATCHES);
#      with DFLASH_FULL=1 (default 0) the same DFlash with every draft layer full attention
#      (dflash-full: vLLM < 0.23 serves any DFlash so; speculators' default masks causally);
#      with REFERENCE=1 (default), beside them: hf_states.py writes transformers' float32 states
#      for the same prepared samples (and a row-shuffled copy, the control), then the same EAGLE-3
#      is trained offline from each (`--hidden-states-path DIR --on-missing raise`; the control
#      beside the others where at most four trainers are planned, else once the online trainers
#      are done: beside six it ran out of GPU memory); with NOISE=1
#      (default) the same EAGLE-3 again with --seed 1 (eagle3-seed1: run-to-run noise); with FP8=1
#      (default 0) a second server on PORT+1 writes the fp8 backend's files
#      (`--hidden-states-backend fp8`) and the same EAGLE-3 trains from it (eagle3-fp8);
#   3. the server stopped, the accept engine (k=3) for the target alone, EAGLE-3 and DFlash, one
#      engine at a time (DFlash through `speculators-hybrid accept --no-baseline`, the user's
#      command, its method read from the drafter's config; beside the others with PARALLEL=all;
#      the engine itself if the command fails), then the controls at once (PARALLEL, below):
#      dflash-full, the ablation, the
#      DFlash with the causal-blocks patch off (dflash-noncausal, as vLLM < 0.26 serves it),
#      two offline-trained EAGLE-3s, the seed-1 EAGLE-3, the EAGLE-3 on stock vLLM (plugin off),
#      eagle3-fp8, EAGLE-3 and DFlash with each reply stopped at its end-of-turn token
#      (eagle3-stop, dflash-stop; the others generate 128 tokens a prompt); DFlash from a copy
#      of its config without M-RoPE only if the as-trained one fails; then, with GRAPHS=1
#      (default 0), target and EAGLE-3 with CUDA graphs.
#   With MTP=1 (default 0) the target gets a native MTP head first (mtp_head.py: random, as a
#   Qwen3.5 checkpoint lays it out), speculators finetunes it (`--speculator-type mtp`) with the
#   plugin's mtp-final-norm patch (mtp) and without (mtp-nonorm), `speculators stitch-mtp` puts
#   each back into a copy of the target, and the accept engine serves each copy with vLLM's own
#   MTP (`--method mtp`), beside the untrained head (mtp-random, the control).
#   With REGEN=1 (default 0) a plain vLLM server (PORT+2) answers the training chats' user turns
#   greedily (`speculators regenerate-responses`, 128 tokens), prepare-data keeps those rows,
#   and EAGLE-3 and DFlash train on them too (eagle3-regen, dflash-regen: on-policy data, the
#   target's own replies, where the others learn the corpus's).
# Each phase's JSON lands in $ACC/results (with the trainers' own validation,
# train-validation.json), which poll copies to $OUT/acc.
set -uo pipefail
ACC=${ACC:-/tmp/stash/acc}
TARGET_S=${TARGET_S:-100}; CHATS=${CHATS:-4000}; STEPS=${STEPS:-700}; EPOCHS=${EPOCHS:-4}; PORT=${PORT:-8100}
ABLATE=${ABLATE:-1}; REFERENCE=${REFERENCE:-1}; NOISE=${NOISE:-1}; DFLASH_FULL=${DFLASH_FULL:-0}
FP8=${FP8:-0}; GRAPHS=${GRAPHS:-0}; PARALLEL=${PARALLEL:-1}; MTP=${MTP:-0}; REGEN=${REGEN:-0}
KNOBS="TARGET_S CHATS STEPS EPOCHS ABLATE REFERENCE NOISE DFLASH_FULL FP8 GRAPHS PARALLEL MTP REGEN"
source "$(dirname "$0")/../stash.sh"  # RUNNER, the environment
say() { echo "$(date +%T) $*" | tee -a "$ACC/status"; }

warm_imports() {  # beside the target's training: the server's first start spent 2.2 minutes
  # before vLLM's first log line (2026-12-07, run 3): the staged packages compiled on every core
  # (stash_compile), then the API server imported once, the slowest imports in logs/imports.log
  local t0=$SECONDS
  stash_compile
  say "imports: compiled in $((SECONDS - t0)) s"
  (cd "$ACC/code" && bash $RUNNER run python3 -X importtime \
    -c "import vllm.entrypoints.openai.api_server" 2> "$ACC/logs/imports.raw")
  say "imports: done in $((SECONDS - t0)) s"
  sort -t'|' -k2 -n "$ACC/logs/imports.raw" | tail -n 25 > "$ACC/logs/imports.log"
  rm -f "$ACC/logs/imports.raw"
}

phase_target() {
  [ -f "$ACC/target/target.json" ] && return 0
  say "target: training $TARGET_S s"
  timeout $((TARGET_S + 240)) bash -c "cd $ACC/code && bash $RUNNER run \
    python3 benchmarks/acceptance/target.py $ACC/target --seconds $TARGET_S" > "$ACC/logs/target.log" 2>&1
  cp "$ACC/target/target.json" "$ACC/results/" && say "target: done" || { say "target: FAILED"; return 1; }
}

mtp_head() {  # MTP=1: the target's native head, before the server reads the target (it skips
  # `mtp.*`, as transformers does); says so and leaves the MTP drafters out if it fails
  [ "$MTP" = 1 ] || return 0
  bash $RUNNER run python3 "$ACC/code/benchmarks/acceptance/mtp_head.py" "$ACC/target" \
    >> "$ACC/logs/target.log" 2>&1 && say "mtp head: added" || say "mtp head: FAILED"
}

stitch() {  # NAME: the newest checkpoint of train-NAME stitched into a copy of the target
  local ck; ck=$(latest "$ACC/train-$1"); [ -n "$ck" ] || return 0
  rm -rf "$ACC/stitched-$1"
  timeout 300 bash $RUNNER run python3 -m speculators stitch-mtp "$ck" "$ACC/target" \
    --output-path "$ACC/stitched-$1" > "$ACC/logs/stitch-$1.log" 2>&1
  say "stitch $1: exit $?"
}

wait_ready() {  # tries pid port
  for _ in $(seq 1 "$1"); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$3/health', timeout=2)" \
      2> /dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 2
  done
  return 1
}

train_one() {  # name speculator-type extra-args...; from the folder $HS offline if set
  local name=$1 kind=$2; shift 2
  local source=(--on-missing generate --vllm-endpoint "http://127.0.0.1:${SERVER_PORT:-$PORT}/v1")
  [ -n "${HS:-}" ] && source=(--hidden-states-path "$HS" --on-missing raise)
  rm -rf "$ACC/train-$name"; mkdir -p "$ACC/train-$name"
  TORCHDYNAMO_DISABLE=${TRAIN_EAGER-1} timeout "${TRAIN_TIMEOUT:-900}" \
    bash $RUNNER run python3 -m speculators_hybrid.cli run -- \
    python3 -m speculators train --speculator-type "$kind" --verifier-name-or-path "$ACC/target" \
    --data-path "${DATA:-$ACC/data}" --save-path "$ACC/train-$name" --log-dir "$ACC/train-$name/logs" \
    "${source[@]}" --target-layer-ids 2 4 5 \
    --total-seq-len 4096 --seed "${SEED:-0}" --max-steps "$STEPS" --epochs "$EPOCHS" --lr 1e-3 \
    --scheduler-type cosine --scheduler-warmup-steps 50 --train-data-ratio 0.98 --num-workers 4 \
    --log-freq 10 "$@" > "$ACC/logs/train-$name.log" 2>&1
  local rc=$?
  say "train $name: exit $rc, $(grep -c 'global_step\|loss' "$ACC/logs/train-$name.log") log lines"
}

reference() {  # transformers' states for the prepared samples, then EAGLE-3 trained from them
  say "hf-states: computing"
  rm -rf "$ACC/hs-hf32" "$ACC/hs-shuffled" "$ACC/results/hf_states.json"
  timeout 600 bash $RUNNER run python3 "$ACC/code/benchmarks/acceptance/hf_states.py" \
    "$ACC/target" "$ACC/data" "$ACC/hs-hf32" --target-layer-ids 2 4 5 \
    --shuffled-copy "$ACC/hs-shuffled" --report "$ACC/results/hf_states.json" --workers 4 \
    > "$ACC/logs/hf-states.log" 2>&1 || { say "hf-states: FAILED"; return 1; }
  say "hf-states: done"
  HS="$ACC/hs-hf32" train_one eagle3-hf32 eagle3 --num-layers 1
}

control() {  # the EAGLE-3 from the row-shuffled states, once the reference states are written
  while [ ! -f "$ACC/results/hf_states.json" ]; do kill -0 "$1" 2>/dev/null || return 1; sleep 1; done
  HS="$ACC/hs-shuffled" train_one eagle3-shuffled eagle3 --num-layers 1
}

start_server() {  # name port launcher-options...: sets $server (its own process group)
  local name=$1 port=$2; shift 2
  rm -rf "$ACC/hs-$name"
  setsid bash $RUNNER run python3 -m speculators_hybrid.cli launch \
    --launcher "$ACC/launch_vllm.py" "$ACC/target" --hidden-states-path "$ACC/hs-$name" "$@" -- \
    --port="$port" --max-model-len=1024 --max-num-seqs=64 --max-num-batched-tokens=8192 \
    --kv-cache-memory-bytes=$((4 << 30)) --gpu-memory-utilization=0.3 \
    --gdn-prefill-backend=triton --enforce-eager > "$ACC/logs/server-$name.log" 2>&1 &
  server=$!
  echo "$server" > "$ACC/server-$name.pid"  # kill -- -PID stops it
}

start_plain() {  # port: a vLLM server without extraction, for regeneration; sets $server
  setsid bash $RUNNER run python3 -m vllm.entrypoints.openai.api_server --model "$ACC/target" \
    --port="$1" --max-model-len=1024 --max-num-seqs=256 --kv-cache-memory-bytes=$((4 << 30)) \
    --gpu-memory-utilization=0.2 --gdn-prefill-backend=triton --enforce-eager \
    > "$ACC/logs/server-regen.log" 2>&1 &
  server=$!
}

regen() {  # pid port: the target's own replies to the training chats, then EAGLE-3 and DFlash
  # trained on them; stops the plain server (its own process group) once they are written
  local pid=$1 port=$2 rc=0
  if wait_ready 300 "$pid" "$port"; then
    say "regen: generating"
    timeout 600 bash $RUNNER run python3 -m speculators regenerate-responses \
      --endpoint "http://127.0.0.1:$port/v1/chat/completions" --model "$ACC/target" \
      --dataset "$ACC/chats-subset.jsonl" --max-tokens 128 --concurrency 128 \
      --sampling-params '{"temperature": 0}' --outfile "$ACC/regen.jsonl" \
      > "$ACC/logs/regen.log" 2>&1 || rc=$?
  else rc=1; fi
  kill -- -"$pid" 2>/dev/null
  say "regen: exit $rc, $(wc -l < "$ACC/regen.jsonl" 2>/dev/null || echo 0) rows"
  [ "$rc" = 0 ] || return 1
  rm -rf "$ACC/data-regen"
  timeout 600 bash $RUNNER run python3 -m speculators prepare-data --model "$ACC/target" \
    --data "$ACC/regen.jsonl" --output "$ACC/data-regen" --seq-length 512 \
    --num-preprocessing-workers 8 > "$ACC/logs/prepare-regen.log" 2>&1 \
    || { say "prepare-data regen: FAILED"; return 1; }
  DATA="$ACC/data-regen" train_one eagle3-regen eagle3 --num-layers 1 & local a=$!
  DATA="$ACC/data-regen" train_one dflash-regen dflash --num-layers 2 --block-size 4 & local b=$!
  wait "$a" "$b"
}

stop_servers() { for p in "${servers[@]}"; do kill -- -"$p" 2>/dev/null; done; }

phase_train() {
  [ -f "$ACC/results/train.done" ] && return 0
  say "server: starting"
  local server servers=() fp8_port=$((PORT + 1))
  start_server file "$PORT"; servers+=("$server"); local main=$server
  local regen_port=$((PORT + 2))
  if wants eagle3-regen; then start_plain "$regen_port"; servers+=("$server"); local plain=$server; fi
  if wants eagle3-fp8; then start_server fp8 "$fp8_port" --hidden-states-backend fp8; servers+=("$server"); fi
  if ! wait_ready 300 "$main" "$PORT"; then say "server: FAILED"; stop_servers; return 1; fi
  say "server: ready"
  local fp8=0; wants eagle3-fp8 && fp8=1  # the fp8 server failing leaves its trainer out
  if [ "$fp8" = 1 ] && ! wait_ready 150 "${servers[1]}" "$fp8_port"; then
    say "server fp8: FAILED (eagle3-fp8 left out)"; fp8=0
  fi
  head -n "$CHATS" "$ACC/target/chats.jsonl" > "$ACC/chats-subset.jsonl"
  rm -rf "$ACC/data"
  timeout 600 bash $RUNNER run python3 -m speculators prepare-data \
    --model "$ACC/target" --data "$ACC/chats-subset.jsonl" --output "$ACC/data" --seq-length 512 \
    --render-endpoint "http://127.0.0.1:$PORT" --num-preprocessing-workers 8 \
    > "$ACC/logs/prepare-data.log" 2>&1 || { say "prepare-data: FAILED"; stop_servers; return 1; }
  say "prepare-data: done"
  local trainers=()  # wait for these only: a bare `wait` would also wait for the server
  if wants eagle3-regen; then regen "$plain" "$regen_port" & trainers+=($!); fi
  train_one eagle3 eagle3 --num-layers 1 & trainers+=($!)
  train_one dflash dflash --num-layers 2 --block-size 4 & trainers+=($!)
  if wants dflash-full; then  # every draft layer full: what vLLM < 0.23 serves
    train_one dflash-full dflash --num-layers 2 --block-size 4 --full-attention-indices 0 1 \
      & trainers+=($!)
  fi
  if wants eagle3-nonorm; then
    SPECULATORS_HYBRID_DISABLED_PATCHES=verifier-norm-eagle3 \
      train_one eagle3-nonorm eagle3 --num-layers 1 & trainers+=($!)
  fi
  local ref=""
  wants eagle3-hf32 && { reference & ref=$!; }
  if wants eagle3-seed1; then  # the same EAGLE-3, another seed: run-to-run noise
    SEED=1 train_one eagle3-seed1 eagle3 --num-layers 1 & trainers+=($!)
  fi
  if wants mtp; then  # the native head finetuned, with the plugin's mtp-final-norm and without
    train_one mtp mtp --num-speculative-steps 3 & trainers+=($!)
    SPECULATORS_HYBRID_DISABLED_PATCHES=mtp-final-norm \
      train_one mtp-nonorm mtp --num-speculative-steps 3 & trainers+=($!)
  fi
  if [ "$fp8" = 1 ]; then
    SERVER_PORT=$fp8_port train_one eagle3-fp8 eagle3 --num-layers 1 \
      --hidden-states-backend fp8 & trainers+=($!)
  fi
  # the control beside them where at most four trainers run at once (~15 GB each on an H100),
  # else once the online trainers are done (2026-12-07: beside six it ran out of GPU memory)
  local early=""
  if [ -n "$ref" ] && [ "$(planned | wc -l)" -le 4 ]; then control "$ref" & early=$!; fi
  wait "${trainers[@]}"
  grep -c '"POST /v1/completions HTTP/1.1" 200' "$ACC"/logs/server-*.log > "$ACC/results/requests_200.txt"
  stop_servers; sleep 5
  if [ -n "$ref" ]; then [ -n "$early" ] || control "$ref"; wait "$ref" $early; fi
  if wants mtp; then stitch mtp; stitch mtp-nonorm; fi
  python3 "$(dirname "$0")/validation.py" "$ACC/logs" \
    > "$ACC/results/train-validation.json"
  touch "$ACC/results/train.done"
}

latest() { find "$1" -name config.json -printf '%T@ %h\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2; }

accept() {  # NAME [VAR=VALUE...] COMMAND...: runs it with the result file as its last argument
  # (and, with $SHARE set, that share of the GPU's memory before it)
  local name=$1; shift
  say "accept $name"
  timeout 420 env "$@" ${SHARE:+--gpu-memory-utilization $SHARE} "$ACC/results/accept-$name.json" \
    > "$ACC/logs/accept-$name.log" 2>&1
  accepted "$name" $?
}

accepted() {  # NAME RC: logs the exit; on failure keeps the engine core's own error, as the
  # engine's JSON has only "initialization failed"; returns RC
  say "accept $1: exit $2"
  [ "$2" = 0 ] || grep -E "Error|Exception" "$ACC/logs/accept-$1.log" | grep -v "^Traceback" \
    | tail -n 5 > "$ACC/results/accept-$1.cause.txt"
  return "$2"
}

accept_cli() {  # NAME DRAFTER: served through the user's command, `speculators-hybrid accept`,
  # with $SHARE of the GPU's memory (0.3 alone)
  local name=$1 out="$ACC/cli-$1"
  say "accept $name (speculators-hybrid accept --no-baseline)"
  rm -rf "$out"
  timeout 420 bash $RUNNER run python3 -m speculators_hybrid.cli accept "$ACC/target" \
    "$ACC/target/heldout.jsonl" --drafter "$2" --no-baseline --k 3 --gpu-memory-utilization "${SHARE:-0.3}" \
    ${ACCEPT_ARGS---eager} --out "$out" > "$ACC/logs/accept-$name.log" 2>&1
  local rc=$?
  cat "$out/drafter.log" >> "$ACC/logs/accept-$name.log" 2> /dev/null
  cp "$out/drafter.json" "$ACC/results/accept-$name.json" 2> /dev/null
  accepted "$name" $rc
}

phase_accept() {
  local a="bash $RUNNER run python3 -m speculators_hybrid.accept.engine ${ACCEPT_ARGS---eager}"
  local args="$ACC/target $ACC/target/heldout.jsonl"
  local eagle; eagle=$(latest "$ACC/train-eagle3")
  local dflash; dflash=$(latest "$ACC/train-dflash")
  local nonorm; nonorm=$(latest "$ACC/train-eagle3-nonorm")
  local hf32; hf32=$(latest "$ACC/train-eagle3-hf32")
  local shuffled; shuffled=$(latest "$ACC/train-eagle3-shuffled")
  local seed1; seed1=$(latest "$ACC/train-eagle3-seed1")
  local dfull; dfull=$(latest "$ACC/train-dflash-full")
  local fp8; fp8=$(latest "$ACC/train-eagle3-fp8")
  local regen_e; regen_e=$(latest "$ACC/train-eagle3-regen")
  local regen_d; regen_d=$(latest "$ACC/train-dflash-regen")
  # PARALLEL=1 (default): the controls (acceptance only) are served at once after target, EAGLE-3
  # and DFlash alone; PARALLEL=all: every engine at once (acceptance only; GRAPHS=1 then times
  # target and EAGLE-3 alone); 0: one at a time. results/parallel.txt names those served at once.
  local side=() pids=()  # wait for these only, never a bare `wait`
  serve() {  # [--beside] NAME ARGS...: through accept (an engine), or $HOW (accept_cli)
    local how=${HOW:-accept}
    if [ "$1" = --beside ]; then
      shift; side+=("$1"); SHARE=0.1 "$how" "$@" & pids+=($!)
    else "$how" "$@"; fi
  }
  local lead="" rest="--beside"
  [ "$PARALLEL" = all ] && lead="--beside"; [ "$PARALLEL" = 0 ] && rest=""
  [ -f "$ACC/results/accept-target.json" ] || serve $lead target $a $args
  [ -n "$eagle" ] && serve $lead eagle3 $a --drafter "$eagle" --method eagle3 --k 3 $args
  # DFlash through the user's command, its method from its config
  [ -n "$dflash" ] && HOW=accept_cli serve $lead dflash "$dflash"
  [ -n "$dfull" ] && serve $rest dflash-full $a --drafter "$dfull" --method dflash --k 3 $args
  # the same DFlash with its blocks non-causal, as vLLM < 0.26 serves it without the plugin's patch
  [ -n "$dflash" ] && serve $rest dflash-noncausal SPECULATORS_HYBRID_DISABLED_PATCHES=dflash-causal-draft-blocks \
    $a --drafter "$dflash" --method dflash --k 3 $args
  [ -n "$nonorm" ] && serve $rest eagle3-nonorm $a --drafter "$nonorm" --method eagle3 --k 3 $args
  [ -n "$shuffled" ] && serve $rest eagle3-shuffled $a --drafter "$shuffled" --method eagle3 --k 3 $args
  [ -n "$hf32" ] && serve $rest eagle3-hf32 $a --drafter "$hf32" --method eagle3 --k 3 $args
  [ -n "$seed1" ] && serve $rest eagle3-seed1 $a --drafter "$seed1" --method eagle3 --k 3 $args
  [ -n "$eagle" ] && serve $rest eagle3-stock SPECULATORS_HYBRID_DISABLE=1 $a --drafter "$eagle" --method eagle3 --k 3 $args
  # the replies alone, each stopped at its end-of-turn token (the others make 128 tokens each)
  [ -n "$eagle" ] && serve $rest eagle3-stop $a --stop-at-end --drafter "$eagle" --method eagle3 --k 3 $args
  [ -n "$dflash" ] && serve $rest dflash-stop $a --stop-at-end --drafter "$dflash" --method dflash --k 3 $args
  [ -n "$fp8" ] && serve $rest eagle3-fp8 $a --drafter "$fp8" --method eagle3 --k 3 $args
  [ -n "$regen_e" ] && serve $rest eagle3-regen $a --drafter "$regen_e" --method eagle3 --k 3 $args
  [ -n "$regen_d" ] && serve $rest dflash-regen $a --drafter "$regen_d" --method dflash --k 3 $args
  local heldout="$ACC/target/heldout.jsonl" name  # MTP: the stitched copy is target and drafter
  for name in mtp mtp-nonorm; do
    [ -f "$ACC/stitched-$name/config.json" ] || continue
    serve $rest $name $a --drafter "$ACC/stitched-$name" --method mtp --k 3 "$ACC/stitched-$name" "$heldout"
  done
  wants mtp && serve $rest mtp-random $a --drafter "$ACC/target" --method mtp --k 3 $args
  if [ ${#pids[@]} -gt 0 ]; then printf '%s\n' "${side[@]}" > "$ACC/results/parallel.txt"; wait "${pids[@]}"; fi
  # the command itself failing (no engine report) must not cost the measurement: the engine
  if [ -n "$dflash" ] && ! [ -f "$ACC/cli-dflash/drafter.json" ]; then
    accept dflash $a --drafter "$dflash" --method dflash --k 3 $args
  fi
  local served="$ACC/results/accept-dflash.json"
  if [ -n "$dflash" ] && { ! [ -f "$served" ] || grep -q '"error"' "$served"; }; then
    rm -rf "$ACC/dflash-1d"; cp -r "$dflash" "$ACC/dflash-1d"  # as trained failed: a 1-D copy
    python3 - "$ACC/dflash-1d/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
def strip(d):
    if isinstance(d, dict):
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(d.get(key), dict):
                d[key].pop("mrope_section", None); d[key].pop("mrope_interleaved", None)
        for v in d.values(): strip(v)
strip(c); json.dump(c, open(p, "w"), indent=2)
EOF
    accept dflash-1d $a --drafter "$ACC/dflash-1d" --method dflash --k 3 $args
  fi
  if [ "$GRAPHS" = 1 ]; then  # GRAPHS=0 saves two engine starts with CUDA graphs
    local g="bash $RUNNER run python3 -m speculators_hybrid.accept.engine"
    accept target-graphs $g $args
    [ -n "$eagle" ] && accept eagle3-graphs $g --drafter "$eagle" --method eagle3 --k 3 $args
  fi
  touch "$ACC/results/accept.done"
}

planned() {  # the drafters the knobs ask for, one a line: the one place that maps knob to drafter
  echo eagle3; echo dflash
  [ "$DFLASH_FULL" = 1 ] && echo dflash-full
  [ "$ABLATE" = 1 ] && echo eagle3-nonorm
  [ "$REFERENCE" = 1 ] && { echo eagle3-hf32; echo eagle3-shuffled; }
  [ "$NOISE" = 1 ] && echo eagle3-seed1
  [ "$FP8" = 1 ] && echo eagle3-fp8
  [ "$MTP" = 1 ] && { echo mtp; echo mtp-nonorm; }
  [ "$REGEN" = 1 ] && { echo eagle3-regen; echo dflash-regen; }
  return 0
}
wants() { [[ $'\n'"$(planned)"$'\n' == *$'\n'"$1"$'\n'* ]]; }  # no pipe: no SIGPIPE race

write_knobs() {  # what the results were made with: tests/gpu/test_acceptance.py reads it
  { for k in $KNOBS; do printf '"%s": "%s"\n' "$k" "${!k}"; done
    printf '"drafters": [%s]\n' "$(planned | sed 's/.*/"&"/' | paste -sd, | sed 's/,/, /g')"
  } | paste -sd, | sed 's/^/{/; s/$/}/' > "$ACC/results/knobs.json"
}

case "${1:-}" in
  start)
    mkdir -p "$ACC/logs" "$ACC/results" "$ACC/code/benchmarks"
    rm -rf "$ACC/code/benchmarks/acceptance"; cp -r benchmarks/acceptance benchmarks/stash.sh "$ACC/code/benchmarks/"
    cp .device/launch_vllm.py "$ACC/launch_vllm.py"
    stash_runner
    # the engine and `speculators-hybrid accept` live in the staged wheel: an older one has neither
    if ! bash "$RUNNER" run python3 -c "import speculators_hybrid.accept.engine" 2> /dev/null; then
      echo "loop: the staged speculators-hybrid has no accept engine: run stage.sh --project-only here, then on-device.sh install" >&2
      exit 2
    fi
    # a Triton cache from an earlier run (poll brings it back as triton.tgz) skips most of the
    # engines' cold start; one that does not match is simply not used
    [ -f .device/triton.tgz ] && mkdir -p "$TRITON_HOME" && tar xzf .device/triton.tgz -C "$TRITON_HOME"
    setsid bash "$ACC/code/benchmarks/acceptance/loop.sh" all > "$ACC/logs/loop.log" 2>&1 < /dev/null &
    sleep 2; cat "$ACC/status" 2>/dev/null; echo "loop started"
    ;;
  all) write_knobs; warm_imports & phase_target && mtp_head && phase_train; phase_accept; say "loop: finished" ;;
  accept) phase_accept ;;
  poll)
    stash_wait "$ACC/results/accept.done" "${2:-60}"
    tar czf "$OUT/acc.tgz" -C "$ACC" results logs status 2>/dev/null
    if [ -f "$ACC/results/accept.done" ]; then  # for the next machine's cold start, if small
      tar czf /tmp/stash/triton.tgz -C "$TRITON_HOME" . 2>/dev/null
      [ "$(stat -c %s /tmp/stash/triton.tgz)" -lt $((40 << 20)) ] && cp /tmp/stash/triton.tgz "$OUT/"
    fi
    for f in "$ACC"/results/*.json; do [ -f "$f" ] && { echo "== $f"; head -c 1500 "$f"; echo; }; done
    cat "$ACC/status"; for f in "$ACC"/logs/*.log; do echo "== $f"; tail -n 4 "$f"; done
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: loop.sh start | poll SECONDS | accept" >&2; exit 2 ;;
esac
