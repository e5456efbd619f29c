#!/usr/bin/env bash
# tfxformer against CTranslate2 on the same weights, on a quiet machine, one run at a time
# (~30 min on a 2-core machine):
#   1. the bench workload (base, random weights, 64 x 24, beam 4, 32 steps), alternating
#      tfxformer and CTranslate2, twice: fp32 vs ct2 float32, --best vs ct2 int8
#      (without and with a vocabulary map of the shortlist's size);
#   2. real text: bench/translate_real.py on test_2016_flickr and newstest2014 (shipped
#      fp32, best = re-export + shortlist, ct2 float32, ct2 int8) on all cores, and on
#      test_2016_flickr pinned to core 0 (one thread each);
#   2b. each system at its best thread setting (best_*: concurrent callers or batches,
#      one per core, one thread each; sentences per batch swept), both sets;
#   3. the memory breakdown (bench/decode_memory.py).
# Logs: bench/results/real_text/<name>.log (each ends with its JSON line(s)); `uptime`
# before every run goes to bench/results/real_text/load.log.
#   bash bench/real_text.sh            # everything
#   bash bench/real_text.sh 'decode'   # only runs whose name matches the regex
#   bash bench/real_text.sh '^best_'   # the best-setting runs only (~20 min)
# Environments: PY = the project's python (default: python), TFXFORMER_CT2_PYTHON = the
# python of a CTranslate2 venv (required; see bench/translate_real.py's docstring).
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH=$PWD
PY=${PY:-python}
CT2PY=${TFXFORMER_CT2_PYTHON:-}
if [ -z "$CT2PY" ] || [ ! -x "$CT2PY" ]; then
  echo "real_text.sh: set TFXFORMER_CT2_PYTHON to the python of a CTranslate2 venv" \
       "(got '${CT2PY}'; see bench/translate_real.py's docstring)" >&2
  exit 2
fi
SHORTLIST=${SHORTLIST:-20,1000}
out=bench/results/real_text
only="${1:-.}"
mkdir -p "$out"

run() {  # run NAME COMMAND...
  local name=$1; shift
  [[ "$name" =~ $only ]] || return 0
  echo "$(date -u +%H:%M:%S) $name: $(uptime)" | tee -a "$out/load.log"
  "$@" 2>&1 | grep -v -E '^(I0000|W0000|E0000|WARNING: All log messages)' \
    > "$out/$name.log"
  tail -1 "$out/$name.log" | cut -c1-300
}

for pass in 1 2; do
  run "decode_fp32_$pass"         "$PY" bench/decode_speed.py --repeats 5
  run "ct2_float32_$pass"         "$CT2PY" bench/ct2_peer.py --compute-type float32
  run "decode_best_$pass"         "$PY" bench/decode_speed.py --repeats 5 --best
  run "ct2_int8_$pass"            "$CT2PY" bench/ct2_peer.py --compute-type int8
  run "ct2_int8_vmap_$pass"       "$CT2PY" bench/ct2_peer.py --compute-type int8 \
                                       --vmap-size 4547   # = decode_speed's BEST_SHORTLIST_SIZE
done
run translate_real "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets test_2016_flickr newstest2014 \
    --systems tfxformer-fp32 tfxformer-best ct2-float32 ct2-int8 --best-shortlist "$SHORTLIST"
run translate_real_1core "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets test_2016_flickr --cpus 0 \
    --systems tfxformer-fp32 tfxformer-best ct2-float32 ct2-int8 --best-shortlist "$SHORTLIST"
# Each system at its best thread setting (translate_real.py --modes): test_2016 swept over
# 16 / 64 / 256 sentences per batch with one caller (TF) or batch (CT2) per core, one thread
# each; then both sets at 64, each mode; then the TF systems without oneDNN.
BEST_SYSTEMS="tfxformer-fp32 tfxformer-best ct2-float32 ct2-int8"
run best_sweep_test2016 "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets test_2016_flickr --modes concurrent --batch-sizes 16 64 256 \
    --systems $BEST_SYSTEMS --best-shortlist "$SHORTLIST"
run best_single_test2016 "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets test_2016_flickr --modes single --systems $BEST_SYSTEMS --best-shortlist "$SHORTLIST"
run best_news1000 "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets newstest2014 --limit 1000 --modes concurrent single \
    --systems $BEST_SYSTEMS --best-shortlist "$SHORTLIST"
run best_eigen_test2016 env TF_ENABLE_ONEDNN_OPTS=0 "$PY" bench/translate_real.py --repeats 3 \
    --sets test_2016_flickr --modes concurrent --systems tfxformer-fp32 tfxformer-best \
    --best-shortlist "$SHORTLIST"
run decode_memory_fp32 "$PY" bench/decode_memory.py
run decode_memory_best "$PY" bench/decode_memory.py --best
echo "$(date -u +%H:%M:%S) end: $(uptime)" | tee -a "$out/load.log"
