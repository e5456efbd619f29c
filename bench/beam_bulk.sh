#!/usr/bin/env bash
# Bulk translation of one corpus by scripts/translate.py (one process) and by
# scripts/translate_beam.py (Apache Beam's DirectRunner, 2 worker processes), one after the
# other, REPEATS times (default 2): wall time, the peak RSS of every process, and whether
# the outputs are identical; then Beam's own fixed cost (an empty pipeline of 1,000
# elements through a Reshuffle on the same runner) and one process's start (TensorFlow
# import and model load, what each Beam worker pays too).
#   bash bench/beam_bulk.sh [CORPUS] [MODEL] [REPEATS]  >> bench/results/beam.log 2>&1
# Needs Apache Beam (pip install -e ".[beam]").
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=3
CORPUS=${1:-../shared/data/multi30k/test_2016_flickr.en}
MODEL=${2:-saved_models/multi30k_en_de}
REPEATS=${3:-2}
RUNNER=(--runner DirectRunner --direct_num_workers 2 --direct_running_mode multi_processing)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

watch_rss() {  # "pid rss_kib role" every second for process $1 and its descendants
  while :; do
    ps -eo pid=,ppid=,rss=,args= | awk -v root="$1" '{
      parent[$1] = $2; rss[$1] = $3
      role[$1] = ($0 ~ /sdk_worker_main/) ? "Beam-worker" : ($0 ~ /spawn_main/) ? "pipeline-process" : "launcher"
      shell[$1] = ($4 ~ /(^|\/)(sh|nice)$/ || $0 ~ /resource_tracker/) }
      END { for (p in parent) { q = p; while (q != root && q in parent && q > 1) q = parent[q]
                                # translate_beam.py forks its pipeline process: same command line
                                if (p != root && parent[p] == root && !shell[root] && role[p] == "launcher")
                                  role[p] = "pipeline-process"
                                if (q == root && !shell[p]) print p, rss[p], role[p] } }'
    sleep 1
  done
}

peaks() {  # the peak RSS of each process in the samples file $1
  awk '{ if ($2 > peak[$1]) peak[$1] = $2; if (role[$1] != "Beam-worker") role[$1] = $3 }
       END { for (p in peak) printf "  %s (pid %s): peak RSS %.0f MiB\n", role[p], p, peak[p] / 1024 }' "$1"
}

run() {  # NAME COMMAND...: runs COMMAND, prints its wall time and each process's peak RSS
  local name=$1; shift
  echo "-- $name: $*"
  local start; start=$(date +%s.%N)
  nice -n 10 "$@" 2> "$WORK/$name.err" & local command=$!
  watch_rss $command > "$WORK/$name.rss" & local watcher=$!
  wait $command
  local status=$?
  local end; end=$(date +%s.%N)
  kill $watcher; wait $watcher 2>/dev/null
  grep "sentences/s" "$WORK/$name.err"
  echo "exit $status; wall $(echo "$end - $start" | bc) s with start-up and model loading; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  peaks "$WORK/$name.rss"
}

echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD) corpus $CORPUS ($(wc -l < "$CORPUS") lines), model $MODEL"
echo "cpu:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for repeat in $(seq "$REPEATS"); do
  run translate sh -c "python scripts/translate.py --model $MODEL < $CORPUS > $WORK/translate.out"
  run beam python scripts/translate_beam.py \
    --model "$MODEL" --input "$CORPUS" --output "$WORK/beam.out" "${RUNNER[@]}"
  echo "-- outputs of repeat $repeat: $(wc -l < "$WORK/translate.out") and" \
       "$(wc -l < "$WORK/beam.out") lines, $(diff "$WORK/translate.out" "$WORK/beam.out" |
       grep -c '^<') differ"
done
run empty-pipeline python -c "
import sys, time
start = time.perf_counter()
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from tfxformer.beam.pipeline import direct_runner
options = PipelineOptions(sys.argv[1:])
with beam.Pipeline(runner=direct_runner(options), options=options) as pipeline:
    pipeline | beam.Create(range(1000)) | beam.Reshuffle() | beam.Map(lambda x: x)
print(f'empty pipeline: {time.perf_counter() - start:.1f} s with Beam import', file=sys.stderr)
" "${RUNNER[@]}"
grep "empty pipeline" "$WORK/empty-pipeline.err"
run model-load python -c "
import sys, time
start = time.perf_counter()
from tfxformer.serving import load_translate_fn
loaded = time.perf_counter()
load_translate_fn(sys.argv[1])(['A dog runs.'])
print(f'process start: import {loaded - start:.1f} s, model load and a first sentence '
      f'{time.perf_counter() - loaded:.1f} s', file=sys.stderr)
" "$MODEL"
grep "process start" "$WORK/model-load.err"
