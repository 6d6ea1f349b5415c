#!/usr/bin/env bash
# Issue 43's device call: BERT-large (bert_config.json) pre-training throughput on one GPU, path by path, beside
# transformers, on real Wikipedia shards, in one call that ends before DEADLINE seconds.
#
#   python -m bench.gpu_speed prepare --out .gpu_speed           # here, on the CPU (10 s; 14 MB)
#   OUT=<folder> bash bench/gpu_pretraining.sh .gpu_speed         # on the GPU machine, .gpu_speed carried
#
# First `gpu_speed check_flash` for each kernel of CHECK (against padded SDPA: check_<kernel>.json), then the smoke
# (SMOKE=1): each path and mode of ROWS once, in its own process, with prepare's two-layer configs, one micro-batch
# a step for two steps, at most SMOKE_S seconds each; smoke.txt gets "<p1_path_mode> pass|fail <s> s" first, and a
# row whose smoke failed is not timed. Then one process a row, in the order of ROWS, each row skipped when fewer
# than MIN_ROW_S seconds are left. A row's name is
# p<phase>_<path>_<mode>[_m<micro>] (with _m<micro>, that micro-batch instead of the phase's BATCH/ACC: the same rows
# a step, ACC = BATCH / micro):
#   path   padded    run_pretraining.py, unpad never: every token of the padded rows goes through every layer
#          unpadded  unpad always: the layers run on the real tokens, attention through bert_padding's variable-length
#                    kernel (flash_varlen on a GPU: FlashAttention-2 with the attention dropout of 0.1)
#          packed    the packed shards (create_pretraining_data.py --pack_sequences 3), unpad auto (= unpadded)
#          sdpa      unpadded, but attention padded around SDPA (the kernel before flash_varlen)
#          model     padded, --compile_scope model: the whole model in one graph (the default until regional
#                    compilation; the rest compile each layer)
#          cudnn     unpadded, attention through cuDNN's fused kernel (varlen_kernel cudnn_varlen); run only after
#                    its check passed in the same call (CHECK)
#          fp8       unpadded, --fp8: the encoder layers' matrix products in float8 (fp8.py, torchao). torchao is not
#                    on the device machine: carry its wheel in .whl (here: pip download --no-deps torchao==0.18.0
#                    -d .whl) and the script installs it into /tmp/site for the call
#          fixed     unpadded in bert_padding.fixed_rows' static layout (unpad_fixed_sizes 4: the token count rounded
#                    up to a quarter of the micro-batch's positions), --compile_mode reduce-overhead: each compiled
#                    layer replayed as a CUDA graph
#          graph     the packed shards in MLPerf's fixed buffer (unpad_fixed_sizes 1), --compile_scope model
#                    --compile_mode reduce-overhead: the whole step, unpadding included, one graph replayed
#          autotune  unpadded, --compile_mode max-autotune-no-cudagraphs: Inductor times its Triton GEMM templates
#                    against cuBLAS per shape and keeps the faster, with the bias and GELU (forward) and GELU's
#                    gradient (backward) fused into a winning template's epilogue
#          bits      unpadded, the hidden dropouts' masks kept in 1 bit an element (dropout_mask_bits 1)
#          nodrop    unpadded with attention dropout 0 (a user's choice, never a default: it opens the kernels
#                    without dropout, torch's varlen_attn; what it costs in held-out loss is a study of its own)
#          hf        transformers' BertForPreTraining (sdpa) on the same shards (python -m bench.gpu_speed hf)
#   mode   compile | eager
# Phase 1: sequence 128, BATCH1 rows a step in ACC1 micro-batches; phase 2: 512, BATCH2 / ACC2 (the dgxh100
# preset's micro-batches, 256 and 64). Each row: WARMUP steps
# (compilation), PROFILE profiled steps (torch.profiler: top kernels, GPU busy share, where the GPU waited for the
# host), then TIMED timed steps; bf16 autocast, NVLAMB lr 6e-3.
# Comes back in $OUT (the device tool returns 8 files): gpu.txt, call.json (date and settings), call.log,
# check_<kernel>.json, user_paths.txt, smoke.txt, summary.json, summary.md, logs.tar.gz (every row's JSON lines, log and profile;
# refreshed after every row).
# Environment (tests/test_gpu_speed.py runs it small on a CPU): ROWS, DEADLINE (540), MIN_ROW_S (45), ROW_MAX_S (180:
# a row is stopped after this long), BATCH1 (1024),
# ACC1 (4), BATCH2 (128), ACC2 (2), WARMUP (3), PROFILE (2), TIMED (8), PRECISION (bf16), WORKERS (4), PYTHON
# (python3), CHECK (the varlen kernels to check first where a GPU is there, "cudnn_varlen"; 0: none), LOG_FREQ (5),
# SMOKE (1; 0: none), SMOKE_S (90), USER_PATHS (1: bench/gpu_user_paths.sh first; 0: not).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
D=${1:-.gpu_speed}
OUT=${OUT:?set OUT to the folder whose files come back}
PYTHON=${PYTHON:-python3}
# The default order puts first what bench/STUDIES.md lists as not yet measured (the static-shape steps under CUDA
# graphs, GEMM epilogues by autotuning, dropout masks in bits, attention without dropout, the packed rows, float8 on
# the rounded unpadded layout, cuDNN's attention, transformers at phase 2's largest micro-batch, the whole-model
# compile, attention padded around SDPA), then the eager rows.
ROWS=${ROWS:-p1_fixed_compile p1_graph_compile p2_fixed_compile p2_graph_compile p1_autotune_compile \
p1_bits_compile p1_nodrop_compile \
p2_packed_compile p1_packed_compile p1_fp8_compile p2_fp8_compile p2_cudnn_compile \
p2_unpadded_compile_m128 p2_hf_compile_m128 p2_unpadded_compile \
p1_unpadded_compile p1_model_compile p2_sdpa_compile p2_padded_compile p1_padded_compile p1_hf_compile \
p2_hf_compile p1_padded_eager p2_padded_eager p1_hf_eager p2_hf_eager}
DEADLINE=${DEADLINE:-540}; MIN_ROW_S=${MIN_ROW_S:-45}; ROW_MAX_S=${ROW_MAX_S:-180}
BATCH1=${BATCH1:-1024}; ACC1=${ACC1:-4}; BATCH2=${BATCH2:-128}; ACC2=${ACC2:-2}
WARMUP=${WARMUP:-3}; PROFILE=${PROFILE:-2}; TIMED=${TIMED:-8}; PRECISION=${PRECISION:-bf16}; WORKERS=${WORKERS:-4}
for f in vocab.txt config_never.json config_always.json config_auto.json config_sdpa.json config_cudnn.json \
         config_fixed.json config_buffer.json config_bits.json config_nodrop.json \
         config_never_smoke.json p1_plain p1_packed p2_plain p2_packed; do
  [[ -e "$D/$f" ]] || { echo "gpu_pretraining.sh: error: $D/$f is missing: make $D with python -m bench.gpu_speed prepare --out $D" >&2; exit 1; }
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
"$PYTHON" -c "import importlib.metadata as m, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', m.version('transformers'), torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | tee -a "$OUT/gpu.txt"
nproc | sed 's/^/host cores /' | tee -a "$OUT/gpu.txt"
"$PYTHON" - "$OUT/call.json" "date=$(date -u '+%Y-%m-%d %H:%M UTC')" "data=$D" "rows=$ROWS" "deadline=$DEADLINE" \
  "batch1=$BATCH1" "acc1=$ACC1" "batch2=$BATCH2" "acc2=$ACC2" "warmup=$WARMUP" "profile=$PROFILE" "timed=$TIMED" \
  "precision=$PRECISION" <<'EOF'
import json, sys  # what ran, for the results page (bench.gpu_speed.markdown); a title and a note can be added
settings = dict(arg.split("=", 1) for arg in sys.argv[2:])
json.dump({"date": settings.pop("date"), "settings": settings}, open(sys.argv[1], "w"), indent=2)
EOF
CHECK=${CHECK:-cudnn_varlen}; [[ $CHECK == 0 ]] && CHECK=""
if [[ -n $CHECK ]] && command -v nvidia-smi > /dev/null; then
  for kernel in $CHECK; do  # each against padded SDPA in fp32: check_<kernel>.json
    timeout 120 "$PYTHON" -m bench.gpu_speed check_flash --kernel "$kernel" --out "$OUT" \
      > "$work/logs/check_$kernel.log" 2>&1
    echo "check $kernel: exit $? at ${SECONDS} s"; tail -n 3 "$work/logs/check_$kernel.log"
  done
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
  local shards=plain config=never extra=()
  case $path in
    padded) ;;
    unpadded) config=always ;;
    packed) shards=packed config=auto ;;
    sdpa) config=sdpa ;;
    model) extra=(--compile_scope model) ;;
    fp8) config=always; extra=(--fp8) ;;
    fixed) config=fixed; extra=(--compile_mode reduce-overhead) ;;
    graph) shards=packed config=buffer; extra=(--compile_scope model --compile_mode reduce-overhead) ;;
    autotune) config=always; extra=(--compile_mode max-autotune-no-cudagraphs) ;;
    bits) config=bits ;;
    nodrop) config=nodrop ;;
    cudnn) config=cudnn
      if ! grep -qs '"passed": true' "$OUT/check_cudnn_varlen.json"; then
        echo "skip $name: cudnn_varlen has not passed its check (CHECK=cudnn_varlen) in this call"; return
      fi ;;
    hf) ;;
    *) echo "unknown path in row $name"; return ;;
  esac
  local left=$((DEADLINE - SECONDS)) steps=$((WARMUP + PROFILE + TIMED)) warmup=$WARMUP profile=$PROFILE log=$name
  local key="p1_${path}_${mode}"
  if [[ -n $smoke ]]; then  # phase 1's shapes, two layers, one micro-batch a step, two steps
    grep -qs "^$key " "$OUT/smoke.txt" && return  # one smoke a path and mode
    seq=128 pred=20 phase=1 batch=$micro acc=1 steps=2 warmup=1 profile=0 log=smoke_$key config=${config}_smoke
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
    local flag=--no_compile; [[ $mode == compile ]] && flag=--compile
    timeout -k 10 "$left" "$PYTHON" run_pretraining.py --do_train --input_dir "$D/p${phase}_$shards" \
      --config_file "$D/config_$config.json" --vocab_file "$D/vocab.txt" --output_dir "$work/ckpt_$log" \
      --max_seq_length "$seq" --max_predictions_per_seq "$pred" --train_batch_size "$batch" \
      --gradient_accumulation_steps "$acc" --learning_rate 6e-3 --warmup_proportion 0.2843 --max_steps "$steps" \
      --skip_checkpoint --log_freq "${LOG_FREQ:-5}" --num_workers "$WORKERS" --throughput_warmup_steps "$warmup" \
      --profile_steps "$profile" --disable_progress_bar --json-summary "$work/logs/$log.json" \
      --precision "$PRECISION" "$flag" "${extra[@]}" > "$work/logs/$log.log" 2>&1
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

if [[ ${USER_PATHS:-1} == 1 ]]; then  # fine-tuning, prediction and the export once, tiny (user_paths.txt)
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
