#!/usr/bin/env bash
# BERT-large pre-training throughput and MFU on one GPU: phase 1 (seq 128) and phase 2 (seq 512), bf16 and fp16,
# eager and torch.compile, through run_pretraining.py itself on real WikiText-2 shards.
#   bash bench/gpu_pretraining.sh DATA_DIR OUT_DIR
# DATA_DIR holds valid.txt, test.txt (WikiText-2) and bert-base-uncased-vocab.txt. Results: OUT_DIR/*.json
# (run_pretraining.py's JSON lines) and OUT_DIR/summary.json.
set -euo pipefail
data=${1:?DATA_DIR}; out=${2:?OUT_DIR}
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$PYTHON" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"

"$PYTHON" -m scripts.text_to_documents --input "$data/valid.txt" "$data/test.txt" --sentences --output "$work/train.txt"
for spec in "128 20" "512 80"; do
  set -- $spec
  mkdir -p "$work/hdf5_$1"
  "$PYTHON" create_pretraining_data.py --input_file "$work/train.txt" --output_file "$work/hdf5_$1/train.hdf5" \
    --vocab_file "$data/bert-base-uncased-vocab.txt" --do_lower_case --max_seq_length "$1" \
    --max_predictions_per_seq "$2" --dupe_factor 2 --random_seed 1 --num_workers 16 --no_progress
done

run() {  # name seq max_pred batch accumulation steps extra-flags...
  local name=$1 seq=$2 pred=$3 batch=$4 acc=$5 steps=$6; shift 6
  "$PYTHON" run_pretraining.py --do_train --input_dir "$work/hdf5_$seq" --config_file bert_config.json \
    --vocab_file "$data/bert-base-uncased-vocab.txt" --output_dir "$work/ckpt_$name" --max_seq_length "$seq" \
    --max_predictions_per_seq "$pred" --train_batch_size "$batch" --gradient_accumulation_steps "$acc" \
    --learning_rate 6e-3 --warmup_proportion 0.2843 --max_steps "$steps" --skip_checkpoint --log_freq 5 \
    --num_workers 4 --throughput_warmup_steps 5 --disable_progress_bar --json-summary "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1 || { echo "$name FAILED"; tail -20 "$out/$name.log"; return 0; }
  echo "$name: $(grep FINAL "$out/$name.json" | tail -1)"
}
run phase1_bf16 128 20 256 2 25 --bf16
run phase1_fp16 128 20 256 2 25 --fp16
run phase2_bf16 512 80 64 4 15 --bf16
run phase1_bf16_compile 128 20 256 2 25 --bf16 --compile
run phase2_bf16_compile 512 80 64 4 15 --bf16 --compile
