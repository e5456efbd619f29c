#!/usr/bin/env bash
# tfxformer against CTranslate2 on the same weights (bench/README.md's two translation
# tables), on a quiet machine, one run at a time (~15 min on a 2-core machine):
#   1. the bench workload (base, random weights, 64 x 24, beam 4, 32 steps): fp32 vs ct2
#      float32, --best vs ct2 int8;
#   2. real text: bench/translate_real.py, the first 1,000 sentences of test_2016_flickr and
#      newstest2014, one call per core (shipped fp32, best = re-export + shortlist,
#      ct2search = re-export with CTranslate2's search, ct2 float32, ct2 int8).
# Logs: bench/results/real_text/<name>.log, each headed by the time, the command and
# `uptime`, ending with its JSON line(s).
#   bash bench/real_text.sh            # everything
#   bash bench/real_text.sh 'decode'   # only runs whose name matches the regex
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
out=bench/results/real_text
only="${1:-.}"
mkdir -p "$out"

run() {  # run NAME COMMAND...
  local name=$1; shift
  [[ "$name" =~ $only ]] || return 0
  echo "# $(date -u '+%F %T UTC') $*; $(uptime)" | tee "$out/$name.log"
  "$@" 2>&1 | grep -v -E '^(I0000|W0000|E0000|WARNING: All log messages)' >> "$out/$name.log"
  tail -1 "$out/$name.log" | cut -c1-300
}

run decode_fp32   "$PY" bench/decode_speed.py --repeats 5
run ct2_float32   "$CT2PY" bench/ct2_peer.py --compute-type float32
run decode_best   "$PY" bench/decode_speed.py --repeats 5 --best
run ct2_int8      "$CT2PY" bench/ct2_peer.py --compute-type int8
run table         "$PY" bench/translate_real.py --ct2-python "$CT2PY" --repeats 3 \
    --sets test_2016_flickr newstest2014 --limit 1000 --modes concurrent \
    --systems tfxformer-fp32 tfxformer-best tfxformer-ct2search ct2-float32 ct2-int8 \
    --best-shortlist 20,1000
