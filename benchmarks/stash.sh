# Sourced by the GPU jobs (acceptance/loop.sh, seed_job/seed.sh, backends/backends.sh,
# runner_v2/proofs.sh): what they share. Each job copies its code under /tmp/stash, where a later
# call replacing the working tree does not touch it, and runs there in its own session; poll waits
# for its `done` file.
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export TRITON_CACHE_AUTOTUNING=1 TRITON_HOME=${TRITON_HOME:-/tmp/stash/triton-home} VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/stash/vllm-cache}
RUNNER=${RUNNER:-/tmp/stash/bin/on-device.sh}  # runs a command in the staged environment

# The staged packages come without bytecode (vLLM unzipped, the wheels installed with pip
# --no-compile), so each first import compiled its modules one at a time: the acceptance loop's
# first server spent 2.2 minutes before vLLM's first log line (2026-12-07). STASH_COMPILE compiles
# every folder on PYTHONPATH (the runners put the staged ones there, the image's own are not) on
# every core, importing nothing; a file that does not compile is skipped.
STASH_COMPILE='import compileall, os; [compileall.compile_dir(d, quiet=2, workers=0) for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isdir(d)]'
stash_compile() {  # [PYTHON...]: the staged Python, through $RUNNER unless given
  [ $# -gt 0 ] || set -- bash "$RUNNER" run python3
  "$@" -c "$STASH_COMPILE" > /dev/null 2>&1
}

stash_runner() {  # the runner, out of the working tree
  if [ -f .device/bin/on-device.sh ]; then mkdir -p /tmp/stash/bin; cp .device/bin/on-device.sh /tmp/stash/bin/; fi
}

stash_start() {  # dir timeout-s name script args...: `script dir --launcher dir/launch_vllm.py args`
  local dir=$1 limit=$2 name=$3 script=$4; shift 4
  [ -f .device/launch_vllm.py ] && cp .device/launch_vllm.py "$dir/launch_vllm.py"
  stash_runner
  # the orchestrator runs in the staged environment, once it is compiled; its commands each go
  # through $RUNNER too
  export -f stash_compile
  RUNNER=$RUNNER STASH_COMPILE=$STASH_COMPILE setsid bash -c "stash_compile; \
    cd $dir/code && timeout $limit bash $RUNNER run \
    python3 $script $dir/work --launcher $dir/launch_vllm.py $*; \
    echo \$? > $dir/done" > "$dir/$name.log" 2>&1 < /dev/null &
  sleep 2; echo "$name started (pid $!)"
}

stash_wait() {  # file seconds: until the file exists or the time is up
  local end=$((SECONDS + ${2:-60}))
  while [ $SECONDS -lt $end ] && ! [ -f "$1" ]; do sleep 5; done
  mkdir -p "${OUT:=/tmp/out}"
}
