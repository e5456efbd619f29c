#!/usr/bin/env bash
# Runs the training benchmarks of bench/README.md one after the other (never two at once:
# 2 cores) and keeps each run's output in bench/results/<name>.log, headed by the time, the
# command and `uptime`; the last line of each log is its JSON result.
#   bash bench/run_all.sh            # everything (~30 min on the 2-core machine)
#   bash bench/run_all.sh 'train_'   # only runs whose name matches the regex
#   bash bench/run_all.sh smoke      # tiny preset, the training and decoding scripts, ~2 min
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH=$PWD
PY=${PY:-python}
mkdir -p bench/results
only="${1:-.}"

run() {  # run NAME COMMAND...
  local name=$1; shift
  [[ "$name" =~ $only ]] || return 0
  echo "# $(date -u '+%F %T UTC') $*; $(uptime)" | tee "bench/results/$name.log"
  "$@" 2>&1 | grep -v -E '^(I0000|W0000|WARNING: All log messages)' \
    | tee -a "bench/results/$name.log" | tail -1
}

T="--steps 6 --warmup 2"
run train_fp32_vs_kerashub       "$PY" bench/train_speed.py $T --peer keras-hub
run train_bf16_vs_kerashub       "$PY" bench/train_speed.py $T --precision bf16 --peer keras-hub
run train_speed_fused_vs_logits  taskset -c 0 "$PY" bench/train_speed.py --steps 4 --warmup 1 \
                                   --peer logits-loss
run train_memory_1thread         taskset -c 1 "$PY" bench/train_memory.py --compare fp32,bf16 \
                                   --losses logits,fused
run train_memory_2threads        taskset -c 1 "$PY" bench/train_memory.py --compare fp32,bf16 \
                                   --losses logits,fused --threads 2

S="--preset tiny --vocab-size 1000"
run smoke_train                  "$PY" bench/train_speed.py $S --steps 2 --warmup 1 --peer keras-hub
run smoke_train_memory           "$PY" bench/train_memory.py $S --steps 1 --warmup 1
run smoke_decode                 "$PY" bench/decode_speed.py $S --repeats 1 --precision bf16 --shortlist-size 300
