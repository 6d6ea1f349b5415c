#!/usr/bin/env bash
# The GPU speed call: BERT-large (bert_config.json) pre-training on one GPU, path by path, on real Wikipedia shards,
# in one call that ends before DEADLINE seconds. The default ROWS are what can pay, sized to time every row in a
# 9-minute call (bench/STUDIES.md, "The next GPU call"); other rows and the microbenchmarks (bench/gpu_micro.py)
# are for calls of their own, as is USER_PATHS=1 (bench/gpu_user_paths.sh first).
#
#   python -m bench.gpu_speed prepare --out .gpu_speed           # here, on the CPU (10 s; 14 MB)
#   OUT=<folder> bash bench/gpu_pretraining.sh .gpu_speed         # on the GPU machine, .gpu_speed carried
#
# Stages: gpu.txt (the GPU, torch, CUDA, cuDNN); the attention dropout probe (dropout.json: each kernel's measured
# rate and scale, `gpu_speed dropout_probe`); the smoke (SMOKE=1): each path and mode of ROWS once, two layers, two
# micro-batches a step for three steps (warm-up, CUDA-graph recording, replay while accumulating), at most SMOKE_S
# seconds, "<p1_path_mode> pass|fail <s> s" in smoke.txt; then one process a row in the order of ROWS, each timed
# only when its smoke passed and MIN_ROW_S seconds are left. A row is p<phase>_<path>_<mode>[_m<micro>]
# (_m<micro>: that micro-batch, the same rows a step), run through run_pretraining.py (hf: transformers):
#   path   padded    --unpad never: every position of the padded rows through every layer
#          unpadded  --unpad always: the layers on the real tokens, attention through the varlen kernel
#          packed    the packed shards (--pack_sequences 3), unpad auto (= unpadded)
#          sdpa      unpadded, attention padded around SDPA (--varlen_kernel padded_sdpa)
#          model     padded, --compile_scope model (the whole model one graph)
#          nodrop    the packed shards, attention dropout 0 (a user's choice: it opens torch's varlen_attn)
#          graph     the packed shards, --static_token_granule GRANULE --compile_scope model --compile_mode
#                    reduce-overhead: the whole step, unpadding included, one CUDA graph replayed
#          fixed     unpadded, --static_token_granule GRANULE --compile_mode reduce-overhead (per-layer graphs)
#          bits      unpadded, --bit_dropout_masks
#          fp8       unpadded, --fp8 (FC1/FC2 in float8, the weight gradient in bf16; torchao carried as a wheel in
#                    .whl: pip download --no-deps torchao==0.18.0 -d .whl)
#          hf        transformers' BertForPreTraining (sdpa) on the same shards (python -m bench.gpu_speed hf)
#   mode   compile | eager
# reduce-overhead rows and their smokes run with TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 (a skipped graph fails the
# row) and TORCH_LOGS=recompiles,cudagraphs; their summaries carry cudagraph_skips and the profile's graph launches.
# Phase 1: sequence 128, BATCH1 rows a step in ACC1 micro-batches; phase 2: 512, BATCH2 / ACC2 (the dgxh100
# preset's micro-batches, 256 and 64). Each row: WARMUP steps (compilation), PROFILE profiled steps, TIMED timed
# steps; bf16 autocast, NVLAMB lr 6e-3. Comes back in $OUT: gpu.txt, dropout.json, call.json, call.log, smoke.txt,
# summary.json, summary.md, logs.tar.gz (every row's JSON lines, log and profile; refreshed after every row).
# Environment (tests/test_gpu_speed.py rehearses the default call small on a CPU): ROWS, DEADLINE (540), MIN_ROW_S
# (60), ROW_MAX_S (200), BATCH1 (1024), ACC1 (4), BATCH2 (128), ACC2 (2), GRANULE (2048), WARMUP (3), PROFILE (2),
# TIMED (8), PRECISION (bf16), WORKERS (4), PYTHON (python3), LOG_FREQ (5), SMOKE (1), SMOKE_S (90), PROBE (1),
# USER_PATHS (0), COMPILE_BACKEND (inductor; the CPU rehearsal: aot_eager).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
D=${1:-.gpu_speed}
OUT=${OUT:?set OUT to the folder whose files come back}
PYTHON=${PYTHON:-python3}
ROWS=${ROWS:-p1_graph_compile p2_graph_compile p1_packed_compile p2_packed_compile p2_nodrop_compile}
DEADLINE=${DEADLINE:-540}; MIN_ROW_S=${MIN_ROW_S:-60}; ROW_MAX_S=${ROW_MAX_S:-200}; GRANULE=${GRANULE:-2048}
BATCH1=${BATCH1:-1024}; ACC1=${ACC1:-4}; BATCH2=${BATCH2:-128}; ACC2=${ACC2:-2}
WARMUP=${WARMUP:-3}; PROFILE=${PROFILE:-2}; TIMED=${TIMED:-8}; PRECISION=${PRECISION:-bf16}; WORKERS=${WORKERS:-4}
for f in vocab.txt config_base.json config_nodrop.json config_base_smoke.json config_nodrop_smoke.json p1_plain \
         p1_packed p2_plain p2_packed; do
  [[ -e "$D/$f" ]] || { echo "gpu_pretraining.sh: error: $D/$f is missing: make $D with python -m bench.gpu_speed prepare" >&2; exit 1; }
done
cd "$(dirname "$0")/.."  # the repository: run_pretraining.py, python -m bench.gpu_speed
if compgen -G ".whl/torchao-*.whl" > /dev/null; then  # the fp8 rows' torchao, carried as a wheel
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/torchao-*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/logs"
exec > >(tee -a "$OUT/call.log") 2>&1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>/dev/null \
    || echo "no nvidia-smi: no GPU"; } | tee "$OUT/gpu.txt"
# transformers' version from its metadata: importing it takes 5 s, which the hf rows pay anyway
"$PYTHON" -c "import importlib.metadata as m, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', m.version('transformers'), torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | tee -a "$OUT/gpu.txt"
nproc | sed 's/^/host cores /' | tee -a "$OUT/gpu.txt"
"$PYTHON" - "$OUT/call.json" "date=$(date -u '+%Y-%m-%d %H:%M UTC')" "data=$D" "rows=$ROWS" "deadline=$DEADLINE" \
  "batch1=$BATCH1" "acc1=$ACC1" "batch2=$BATCH2" "acc2=$ACC2" "granule=$GRANULE" "warmup=$WARMUP" \
  "profile=$PROFILE" "timed=$TIMED" "precision=$PRECISION" <<'EOF'
import json, sys  # what ran, for the results page (bench.gpu_speed.markdown); a title and a note can be added
settings = dict(arg.split("=", 1) for arg in sys.argv[2:])
json.dump({"date": settings.pop("date"), "settings": settings}, open(sys.argv[1], "w"), indent=2)
EOF
if [[ ${PROBE:-1} == 1 ]]; then  # each attention kernel's dropout rate, measured (dropout.json)
  timeout 120 "$PYTHON" -m bench.gpu_speed dropout_probe --out "$OUT" > "$work/logs/dropout_probe.log" 2>&1
  echo "dropout probe: exit $? at ${SECONDS} s"; tail -n 4 "$work/logs/dropout_probe.log"
fi

run_row() {  # name: p<phase>_<path>_<mode>[_m<micro>]; with "smoke": that path and mode, small (smoke.txt)
  local name=$1 smoke=${2:-} phase path mode micro
  IFS=_ read -r phase path mode micro <<< "$name"
  phase=${phase#p}
  local seq=128 pred=20 batch=$BATCH1 acc=$ACC1
  [[ $phase == 2 ]] && { seq=512; pred=80; batch=$BATCH2; acc=$ACC2; }
  if [[ -n $micro ]]; then
    micro=${micro#m}
    if ! [[ $micro =~ ^[0-9]+$ ]] || (( micro < 1 || batch % micro )); then
      echo "skip $name: the micro-batch must divide the phase's $batch rows a step"; return
    fi
    acc=$((batch / micro))
  fi
  micro=$((batch / acc))
  local shards=plain config=base extra=() graphs=()
  case $path in
    padded) extra=(--unpad never) ;;
    unpadded) extra=(--unpad always) ;;
    packed) shards=packed ;;
    sdpa) extra=(--unpad always --varlen_kernel padded_sdpa) ;;
    model) extra=(--compile_scope model) ;;
    nodrop) shards=packed config=nodrop ;;
    graph) shards=packed
      extra=(--static_token_granule "$GRANULE" --compile_scope model --compile_mode reduce-overhead) ;;
    fixed) extra=(--unpad always --static_token_granule "$GRANULE" --compile_mode reduce-overhead) ;;
    bits) extra=(--unpad always --bit_dropout_masks) ;;
    fp8) extra=(--unpad always --fp8) ;;
    hf) ;;
    *) echo "unknown path in row $name"; return ;;
  esac
  [[ " ${extra[*]} " == *" reduce-overhead "* ]] && graphs=(TORCHINDUCTOR_CUDAGRAPH_OR_ERROR=1 TORCH_LOGS=recompiles,cudagraphs)
  local left=$((DEADLINE - SECONDS)) steps=$((WARMUP + PROFILE + TIMED)) warmup=$WARMUP profile=$PROFILE log=$name
  local key="p1_${path}_${mode}"
  if [[ -n $smoke ]]; then  # phase 1's shapes, two layers, two micro-batches a step, three steps
    grep -qs "^$key " "$OUT/smoke.txt" && return  # one smoke a path and mode
    seq=128 pred=20 phase=1 batch=$((2 * micro)) acc=2 steps=3 warmup=1 profile=0 log=smoke_$key config=${config}_smoke
    (( left > ${SMOKE_S:-90} )) && left=${SMOKE_S:-90}
  else
    if [[ ${SMOKE:-1} == 1 ]] && ! grep -qs "^$key pass" "$OUT/smoke.txt"; then
      echo "skip $name: its smoke ($key) did not pass"; return
    fi
    if (( left < MIN_ROW_S )); then echo "skip $name: ${left} s left"; return; fi
    (( left > ROW_MAX_S )) && left=$ROW_MAX_S
  fi
  local started=$SECONDS status
  echo "${smoke:-row} $name (${left} s left at ${SECONDS} s)"
  if [[ $path == hf ]]; then
    local flag=(); [[ $mode == compile ]] && flag=(--compile)
    timeout -k 10 "$left" "$PYTHON" -m bench.gpu_speed hf --input_dir "$D/p${phase}_plain" \
      --config "$D/config_${config}.json" --json-summary "$work/logs/$log.json" --train_batch_size "$batch" \
      --gradient_accumulation_steps "$acc" --max_steps "$steps" --throughput_warmup_steps "$warmup" \
      --profile_steps "$profile" --precision "$PRECISION" "${flag[@]}" > "$work/logs/$log.log" 2>&1
    status=$?
  else
    local flag=(--no_compile); [[ $mode == compile ]] && flag=(--compile --compile_backend "${COMPILE_BACKEND:-inductor}")
    env "${graphs[@]}" timeout -k 10 "$left" "$PYTHON" run_pretraining.py --do_train --input_dir "$D/p${phase}_$shards" \
      --config_file "$D/config_$config.json" --vocab_file "$D/vocab.txt" --output_dir "$work/ckpt_$log" \
      --max_seq_length "$seq" --max_predictions_per_seq "$pred" --train_batch_size "$batch" \
      --gradient_accumulation_steps "$acc" --learning_rate 6e-3 --warmup_proportion 0.2843 --max_steps "$steps" \
      --skip_checkpoint --log_freq "${LOG_FREQ:-5}" --num_workers "$WORKERS" --throughput_warmup_steps "$warmup" \
      --profile_steps "$profile" --disable_progress_bar --json-summary "$work/logs/$log.json" \
      --precision "$PRECISION" "${flag[@]}" "${extra[@]}" > "$work/logs/$log.log" 2>&1
    status=$?
    [[ -f "$work/ckpt_$log/profile.json" ]] && cp "$work/ckpt_$log/profile.json" "$work/logs/$log.profile.json"
    rm -rf "$work/ckpt_$log"
  fi
  if [[ -n $smoke ]]; then
    local verdict=pass; [[ $status == 0 ]] || verdict="fail: $(tail -n 1 "$work/logs/$log.log")"
    echo "$key $verdict ($((SECONDS - started)) s)" | tee -a "$OUT/smoke.txt"
    return
  fi
  echo "$name $phase $path $mode $((SECONDS - started)) $status $micro" >> "$work/rows.txt"
  echo "row $name: exit $status in $((SECONDS - started)) s"
  [[ $status == 0 ]] || tail -n 5 "$work/logs/$name.log"
  "$PYTHON" -m bench.gpu_speed summarize "$work" --out "$OUT" > /dev/null 2>&1 || echo "summarize failed"
  tar -czf "$OUT/logs.tar.gz" -C "$work" logs rows.txt
}

if [[ ${USER_PATHS:-0} == 1 ]]; then  # fine-tuning, prediction and the export once, tiny (user_paths.txt)
  OUT="$OUT" PYTHON="$PYTHON" PRECISION="$PRECISION" bash bench/gpu_user_paths.sh "$D"
fi
if [[ ${SMOKE:-1} == 1 ]]; then  # every path and mode once, small, before any row is timed
  for row in $ROWS; do
    run_row "$row" smoke
  done
fi
for row in $ROWS; do
  run_row "$row"
done
"$PYTHON" -m bench.gpu_speed summarize "$work" --out "$OUT"
echo "call done at ${SECONDS} s"
