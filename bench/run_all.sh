#!/usr/bin/env bash
# Runs the benchmark set one after the other (never two at once: 2 cores) and keeps each
# run's output in bench/results/<name>.log; the last line of each log is its JSON result.
#   bash bench/run_all.sh            # everything (~1.5 h on the 2-core machine)
#   bash bench/run_all.sh 'train_'   # only runs whose name matches the regex
#   bash bench/run_all.sh smoke      # tiny preset, every script, ~2 min
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3
mkdir -p bench/results
only="${1:-.}"

run() {  # run NAME SCRIPT ARGS...
  local name=$1; shift
  [[ "$name" =~ $only ]] || return 0
  echo "== $name: ${PY:-python} $*"
  "${PY:-python}" "$@" 2>&1 | grep -v -E '^(I0000|W0000|WARNING: All log messages)' \
    | tee "bench/results/$name.log" | tail -1
}

T="--steps 6 --warmup 2"
D="--repeats 5"
run train_fp32_vs_kerashub        bench/train_speed.py $T --peer keras-hub
run train_bf16_vs_kerashub        bench/train_speed.py $T --precision bf16 --peer keras-hub
run train_fp32_xla                bench/train_speed.py $T --xla
run decode_beam4_fp32             bench/decode_speed.py $D
run decode_beam4_fp32_static      bench/decode_speed.py $D --static-cache
run decode_beam4_fp32_xla         bench/decode_speed.py $D --xla
run decode_beam4_bf16             bench/decode_speed.py $D --precision bf16
run decode_greedy_fp32            bench/decode_speed.py $D --greedy
run decode_greedy_fp32_xla        bench/decode_speed.py $D --greedy --xla
run decode_beam4_bf16_xla         bench/decode_speed.py $D --precision bf16 --xla
run profile_train                 bench/profile_ops.py --what train --steps 2
run profile_beam                  bench/profile_ops.py --what beam --steps 2
run train_fp32_xla_vs_kerashub    bench/train_speed.py $T --xla --peer keras-hub
run complexity                    bench/complexity.py
# CTranslate2 in the same run (TFXFORMER_CT2_PYTHON: the python of a venv with
# `pip install ctranslate2 numpy`; skipped, with a note, when it is not set)
CT2PY=${TFXFORMER_CT2_PYTHON:-}
if [ -z "$CT2PY" ] || [ ! -x "$CT2PY" ]; then
  echo "== CTranslate2 runs skipped: set TFXFORMER_CT2_PYTHON to the python of a CTranslate2 venv" >&2
else
  PY=$CT2PY run ct2_beam4_fp32                          bench/ct2_peer.py --compute-type float32
  PY=$CT2PY run ct2_beam4_int8                          bench/ct2_peer.py --compute-type int8
  PY=$CT2PY run ct2_greedy_fp32                         bench/ct2_peer.py --compute-type float32 --beams 1
fi
run scaling_train                 bench/train_speed.py --lengths 16,32,64,128,256,512 --steps 2 --warmup 1
run scaling_decode                bench/decode_speed.py --lengths 16,32,64,128,256,512 --batch-size 8 --repeats 2

S="--preset tiny --vocab-size 1000"
run smoke_train                   bench/train_speed.py $S --steps 2 --warmup 1 --peer keras-hub
run smoke_train_scaling           bench/train_speed.py $S --steps 1 --warmup 1 --lengths 16,32
run smoke_decode                  bench/decode_speed.py $S --repeats 1
run smoke_complexity              bench/complexity.py --d-model 64 --lengths 16,64 --repeats 1 --plot /tmp/complexity_smoke.png
run smoke_profile                 bench/profile_ops.py $S --what beam --steps 1 --top 5
run smoke_decode_memory           bench/decode_memory.py $S
