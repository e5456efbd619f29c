#!/usr/bin/env bash
# One prepared GPU check of tfxformer training ; <= 8 minutes on one GPU.
#
#   bash bench/gpu_check.sh [--cpu] [--data DIR] [--out DIR]
#
# Prints one JSON line per figure (and writes them to OUT/gpu_check.jsonl):
#   1. the base training step (25k-token batches) in fp16 (loss scaling) and bf16, with
#      and without XLA: target tokens/s, MFU against the GPU's peak, peak device memory;
#   2. a few hundred real steps of scripts/train_wmt.py --preset base on a local corpus
#      (DATA, default ../shared/data/multi30k, else .gpu_data/multi30k in the repo):
#      loss goes down, checkpoints, then a resume that continues from the last one;
#   3. beam-4 decoding speed (bench/decode_speed.py, base model);
#   4. MirroredStrategy over all GPUs found (the step of 1 on every GPU, global batch x N).
# --cpu: the same code paths at tiny sizes on the CPU (a dry run, ~2-4 min on 2 cores).
#
# Python: $PYTHON, else .venv/bin/python, else python3; it needs TensorFlow 2.21 and this
# repo's requirements. Without TensorFlow the script makes .venv-gpu and runs
# `pip install -e .` there (with --find-links $WHEELS when set, for an offline machine).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=gpu DATA="" OUT="${OUT:-bench/results/gpu_check}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --data) DATA="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (accepted: --cpu, --data DIR, --out DIR)" >&2
       exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
JSONL="$OUT/gpu_check.jsonl"; : > "$JSONL"
emit() { echo "$1" | tee -a "$JSONL"; }
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if ! "$PY" -c "import tensorflow" 2>/dev/null; then
  echo "gpu_check.sh: $PY has no TensorFlow; installing the repo into .venv-gpu" >&2
  python3 -m venv .venv-gpu
  PY=.venv-gpu/bin/python
  "$PY" -m pip install -q ${WHEELS:+--no-index --find-links "$WHEELS"} -e . || {
    echo "gpu_check.sh: pip install -e . failed (offline? set WHEELS=DIR of wheels)" >&2
    exit 2; }
fi

if [ "$MODE" = gpu ]; then
  command -v nvidia-smi >/dev/null || { echo "gpu_check.sh: no nvidia-smi: no NVIDIA GPU here; use --cpu for a dry run" >&2; exit 2; }
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  emit "{\"figure\": \"machine\", \"gpu\": \"$GPU_NAME\", \"gpus\": $GPUS, \"driver\": \"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)\"}"
else
  GPU_NAME=cpu GPUS=0
fi

# 1 and 4: the training step, per precision and XLA, then over all GPUs.
"$PY" bench/gpu_check_step.py --mode "$MODE" --gpu-name "$GPU_NAME" | tee -a "$JSONL"

# 2: real steps of train_wmt.py, then a resume.
if [ -z "$DATA" ]; then
  for d in ../shared/data/multi30k .gpu_data/multi30k; do [ -f "$d/train.en" ] && DATA=$d && break; done
fi
[ -n "$DATA" ] || { echo "gpu_check.sh: no corpus: pass --data DIR (train/val .en/.de)" >&2; exit 2; }
RUN=$(mktemp -d)/run
if [ "$MODE" = gpu ]; then
  FLAGS="--preset base --precision bf16 --vocab-size 8000 --batch-tokens 25000 --warmup-steps 100 --checkpoint-every 100 --log-every 50"
  STEPS=300 MORE=350
else
  FLAGS="--preset tiny --vocab-size 400 --batch-tokens 1024 --max-length 64 --warmup-steps 10 --checkpoint-every 10 --log-every 5 --cpu-devices 2"
  STEPS=20 MORE=25
fi
COMMON="--data $DATA --model-dir $RUN --eval-every 0 --eval-sentences 0 --average-last 0 $FLAGS"
t0=$(date +%s.%N)
"$PY" scripts/train_wmt.py $COMMON --train-steps $STEPS > "$OUT/train.json" 2> "$OUT/train.err" || { tail -20 "$OUT/train.err" >&2; exit 1; }
t1=$(date +%s.%N)
"$PY" scripts/train_wmt.py $COMMON --train-steps $MORE > "$OUT/resume.json" 2> "$OUT/resume.err" || { tail -20 "$OUT/resume.err" >&2; exit 1; }
t2=$(date +%s.%N)
emit "$("$PY" - "$RUN/train.log" "$STEPS" "$MORE" "$t0" "$t1" "$t2" <<'PY'
import json, re, sys
log, steps, more, t0, t1, t2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(float, sys.argv[4:])
text = open(log, encoding="utf-8").read()
losses = [(int(s), float(v)) for s, v in re.findall(r"step (\d+) loss ([0-9.naninf]+) lr", text)]
tok = [float(v) for v in re.findall(r"target tokens/s (\d+)", text)]
resumed = re.findall(r"Resumed from \S+ at step (\d+)", text)
first, last = losses[0][1], [v for s, v in losses if s <= steps][-1]
print(json.dumps({"figure": "train_wmt", "steps": steps, "resume_to": more,
                  "loss_first_logged": first, "loss_at_steps": last,
                  "loss_goes_down": last < first, "resumed_at_step": int(resumed[-1]) if resumed else None,
                  "resume_ok": bool(resumed) and int(resumed[-1]) == steps and losses[-1][0] == more,
                  "target_tokens_per_second_last_window": tok[-1] if tok else None,
                  "seconds_first_run": round(t1 - t0, 1), "seconds_resume_run": round(t2 - t1, 1)}))
PY
)"

# 3: beam-4 decoding speed.
if [ "$MODE" = gpu ]; then DEC="--preset base --batch-size 64 --repeats 3"; else DEC="--preset tiny --vocab-size 400 --batch-size 4 --decode-steps 8 --repeats 1"; fi
"$PY" bench/decode_speed.py $DEC --beam-size 4 > "$OUT/decode.log" 2>&1 || { tail -20 "$OUT/decode.log" >&2; exit 1; }
emit "$("$PY" -c "import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); r['figure']='beam4_decode'; print(json.dumps(r))" "$OUT/decode.log")"
emit "{\"figure\": \"total\", \"mode\": \"$MODE\", \"seconds\": $(( $(date +%s) - START ))}"
