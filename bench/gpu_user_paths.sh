#!/usr/bin/env bash
# Issue 52 item 7: every user path once on the GPU, tiny, so that a DGX user's first command is known to work:
# one pre-training step of a two-layer model (run_pretraining.py, its ckpt_1.pt the start of the rest), fine-tuning
# (run_glue.py, run_squad.py, run_swag.py: two steps each), prediction
# (inference.py, both modes; extract_features.py) and the ONNX export (triton/export_model.py), in PRECISION.
#
#   OUT=<folder> bash bench/gpu_user_paths.sh .gpu_speed     # gpu_pretraining.sh runs it first (USER_PATHS=1)
#
# The inputs are `python -m bench.gpu_speed prepare`'s: tasks/ (real MRPC pairs, SQuAD questions, SWAG's layout,
# lines), config_base_smoke.json and vocab.txt. Each command runs in its own process, at most USER_PATH_S (120)
# seconds; user_paths.txt gets "<name> pass|fail: <its last line> (<s> s)". Environment: PRECISION (bf16; the
# CPU rehearsal fp32), PYTHON (python3).
set -u
D=${1:?give the folder of python -m bench.gpu_speed prepare}
OUT=${OUT:?set OUT to the folder whose files come back}
PYTHON=${PYTHON:-python3}
PRECISION=${PRECISION:-bf16}
[[ -d "$D/tasks" && -f "$D/config_base_smoke.json" ]] \
  || { echo "gpu_user_paths.sh: error: $D has no tasks/: make it with python -m bench.gpu_speed prepare" >&2; exit 1; }
D=$(cd "$D" && pwd)
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
T=$D/tasks
model=(--init_checkpoint "$work/pre/ckpt_1.pt" --config_file "$D/config_base_smoke.json" --vocab_file "$D/vocab.txt"
       --do_lower_case)
fine_tune=(--max_steps 2 --train_batch_size 8 --precision "$PRECISION")

check() {  # name command...: one line in user_paths.txt
  local name=$1 started=$SECONDS status verdict=pass
  shift
  timeout -k 10 "${USER_PATH_S:-120}" "$@" > "$work/$name.log" 2>&1
  status=$?
  [[ $status == 0 ]] || verdict="fail: $(tail -n 1 "$work/$name.log")"
  echo "$name $verdict ($((SECONDS - started)) s)" | tee -a "$OUT/user_paths.txt"
}

check run_pretraining "$PYTHON" run_pretraining.py --do_train --input_dir "$D/p1_plain" \
  --config_file "$D/config_base_smoke.json" --vocab_file "$D/vocab.txt" --output_dir "$work/pre" \
  --max_seq_length 128 --max_predictions_per_seq 20 --train_batch_size 8 --max_steps 1 --precision "$PRECISION" \
  --num_workers 0 --disable_progress_bar
check run_glue "$PYTHON" run_glue.py --task_name mrpc --data_dir "$T/MRPC" "${model[@]}" --output_dir "$work/glue" \
  --do_train --do_eval --max_seq_length 64 "${fine_tune[@]}"
check run_squad "$PYTHON" run_squad.py --train_file "$T/squad/train.json" --predict_file "$T/squad/dev.json" \
  "${model[@]}" --output_dir "$work/squad" --do_train --do_predict --max_seq_length 128 --doc_stride 64 \
  "${fine_tune[@]}"
check run_swag "$PYTHON" run_swag.py --data_dir "$T/swag" "${model[@]}" --output_dir "$work/swag" --do_train \
  --do_eval --max_seq_length 64 "${fine_tune[@]}"
check inference_qa "$PYTHON" inference.py --init_checkpoint "$work/squad/model.pt" --vocab_file "$D/vocab.txt" \
  --question "Which team won?" --context "$(head -n 2 "$T/lines.txt" | tr '\n' ' ')" --precision "$PRECISION"
check inference_classify "$PYTHON" inference.py --mode classify --init_checkpoint "$work/glue/model.pt" \
  --vocab_file "$D/vocab.txt" --text_a "$(sed -n 1p "$T/lines.txt")" --text_b "$(sed -n 2p "$T/lines.txt")" \
  --precision "$PRECISION"
check extract_features "$PYTHON" extract_features.py --input_file "$T/lines.txt" --output_file "$work/features.jsonl" \
  --init_checkpoint "$work/glue/model.pt" --vocab_file "$D/vocab.txt" --layers -1 --precision "$PRECISION"
check onnx_export "$PYTHON" triton/export_model.py --checkpoint "$work/squad/model.pt" --task qa \
  --vocab_file "$D/vocab.txt" --output_dir "$work/export" --format onnx --max_seq_length 128
