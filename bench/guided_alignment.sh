#!/usr/bin/env bash
# Guided alignment against the same fine-tune without it (docs/markup.md, "Guided alignment").
# The shipped EN->DE's own alignments of Multi30k train, symmetrized with the DE->EN model's
# (scripts/align.py); 1,500 updates from the shipped EN->DE with and without them, one core
# each, at once; then markup placement (bench/markup.py, all 1,000 test_2016 sources) and
# BLEU (scripts/evaluate.py, alpha 1.4 as the shipped model) of both and of the shipped model.
# About 25 minutes on 2 cores; prints what bench/results/guided_alignment.log holds.
#   bash bench/guided_alignment.sh WORK_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:?usage: bash bench/guided_alignment.sh WORK_DIR}
DATA=../shared/data/multi30k
mkdir -p "$WORK"
python scripts/align.py --model saved_models/multi30k_en_de \
  --reverse-model saved_models/multi30k_de_en --src $DATA/train.en --tgt $DATA/train.de \
  --output "$WORK/train.align" 2>&1 | tail -n 1
COMMON=(--init-from saved_models/multi30k_en_de --data $DATA --batch-tokens 4096
        --max-length 128 --train-steps 1500 --warmup-steps 500 --lr-scale 0.5
        --precision bf16 --cpu-devices 1 --checkpoint-every 100 --keep-checkpoints 10
        --average-last 5 --eval-every 0 --log-every 100)
taskset -c 0 python scripts/train_wmt.py "${COMMON[@]}" --model-dir "$WORK/guided" \
  --guided-alignment "$WORK/train.align" --export-dir "$WORK/guided_export" \
  > "$WORK/guided.log" 2>&1 &
taskset -c 1 python scripts/train_wmt.py "${COMMON[@]}" --model-dir "$WORK/plain" \
  --export-dir "$WORK/plain_export" > "$WORK/plain.log" 2>&1
wait
for model in "$WORK/guided_export" "$WORK/plain_export" saved_models/multi30k_en_de; do
  echo "== $model"
  python scripts/evaluate.py --model "$model" --data $DATA --sets test_2016_flickr \
    test_2017_flickr --alpha 1.4 2> /dev/null | grep '^| .*flickr'
  python bench/markup.py --model "$model" --limit 1000 2> /dev/null
done
