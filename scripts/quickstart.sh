#!/usr/bin/env bash
# Sets up the environment, then runs the main job: train a small EN->DE model, export it as a
# TF Serving SavedModel, and translate with it. Offline here it trains on Multi30k from
# ../shared/data; elsewhere (no such folder) on WMT14 through tensorflow-datasets.
# It trains in the precision --precision auto picks for the machine (mixed bfloat16 on a CPU
# with AVX512_BF16 or AMX-BF16, float32 on one without), named with its reason in the log.
# Override with environment variables: DATA, PRESET, STEPS, RUN_DIR, EXPORT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3

DATA=${DATA:-../shared/data/multi30k}
[ -d "$DATA" ] || DATA=wmt14
PRESET=${PRESET:-small}
STEPS=${STEPS:-600}
RUN_DIR=${RUN_DIR:-runs/quickstart}
EXPORT_DIR=${EXPORT_DIR:-saved_models/quickstart}

python scripts/train_wmt.py --data "$DATA" --src en --tgt de --preset "$PRESET" \
  --vocab-size 8000 --batch-tokens 6144 --max-length 128 --train-steps "$STEPS" \
  --warmup-steps 800 --lr-scale 2 --checkpoint-every 100 --average-last 3 \
  --eval-every 300 --eval-sentences 200 --cpu-devices 2 --precision auto \
  --model-dir "$RUN_DIR" --export-dir "$EXPORT_DIR"

if [ -f "$DATA/test_2016_flickr.en" ]; then
  head -n 5 "$DATA/test_2016_flickr.en" > /tmp/quickstart.en
else
  printf 'A man is riding a bicycle down the street.\nTwo dogs play in the snow.\n' \
    > /tmp/quickstart.en
fi
echo "--- translating with the exported SavedModel ($EXPORT_DIR):"
python scripts/translate.py --model "$EXPORT_DIR" < /tmp/quickstart.en | paste /tmp/quickstart.en -
