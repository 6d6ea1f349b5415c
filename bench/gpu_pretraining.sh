#!/usr/bin/env bash
# BERT-large pre-training throughput on one GPU, through run_pretraining.py itself on real WikiText-2 shards:
# phase 1 (seq 128) and phase 2 (seq 512), bf16, each as
#   padded    the padded path (config unpad "never"): every padded token goes through every GEMM
#   unpadded  the unpadded path (unpad "always"): real tokens only, variable-length attention
#   packed    shards written with create_pretraining_data.py --pack_sequences 3 (unpad "auto")
# times eager and torch.compile (compile keeps the padded path unless unpad is "always"), plus fp16 eager phase 1.
# Each row reports rows/s, real sequences/s, real tokens/s, MFU (real tokens only, against the dense bf16 peak)
# and peak memory, from run_pretraining.py's FINAL line.
#   bash bench/gpu_pretraining.sh DATA_DIR OUT_DIR
# DATA_DIR holds valid.txt, test.txt (WikiText-2) and bert-base-uncased-vocab.txt. Results: OUT_DIR/<row>.json
# (run_pretraining.py's JSON lines), OUT_DIR/summary.json and OUT_DIR/summary.md.
# Smaller settings (the test runs this on the CPU): BENCH_CONFIG (model config; default bert_config.json),
# BENCH_BATCH1/BENCH_ACC1/BENCH_STEPS1 (phase 1: 256/2/25), BENCH_BATCH2/BENCH_ACC2/BENCH_STEPS2 (64/4/15),
# BENCH_MODES ("eager compile"), BENCH_PRECISION (bf16), BENCH_FP16 (1: add the fp16 row), BENCH_WARMUP (5 steps
# left out of the timing), BENCH_WORKERS (16).
set -euo pipefail
data=${1:?usage: bash bench/gpu_pretraining.sh DATA_DIR OUT_DIR}; out=${2:?usage: bash bench/gpu_pretraining.sh DATA_DIR OUT_DIR}
PYTHON=${PYTHON:-python3}
config=${BENCH_CONFIG:-bert_config.json}
modes=${BENCH_MODES:-eager compile}
warmup=${BENCH_WARMUP:-5}
precision=${BENCH_PRECISION:-bf16}
workers=${BENCH_WORKERS:-16}
for f in valid.txt test.txt bert-base-uncased-vocab.txt; do
  [[ -f "$data/$f" ]] || { echo "gpu_pretraining.sh: error: $data/$f is missing (DATA_DIR needs WikiText-2's valid.txt and test.txt and the uncased vocabulary)" >&2; exit 1; }
done
cd "$(dirname "$0")/.."  # the repository: python -m scripts.text_to_documents
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi: no GPU"; } \
  | tee "$out/gpu.txt"
"$PYTHON" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | tee -a "$out/gpu.txt"

"$PYTHON" -m scripts.text_to_documents --input "$data/valid.txt" "$data/test.txt" --sentences --output "$work/train.txt"
for spec in "128 20" "512 80"; do
  set -- $spec
  for kind in plain packed; do
    extra=(); [[ $kind == packed ]] && extra=(--pack_sequences 3)
    mkdir -p "$work/hdf5_${kind}_$1"
    "$PYTHON" create_pretraining_data.py --input_file "$work/train.txt" --output_file "$work/hdf5_${kind}_$1/train.hdf5" \
      --vocab_file "$data/bert-base-uncased-vocab.txt" --do_lower_case --max_seq_length "$1" \
      --max_predictions_per_seq "$2" --dupe_factor 2 --random_seed 1 --num_workers "$workers" --no_progress "${extra[@]}"
  done
done
for unpad in never always auto; do  # the same model, three settings of its unpadding switch
  "$PYTHON" - "$config" "$work/config_$unpad.json" "$unpad" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config["unpad"] = sys.argv[3]
json.dump(config, open(sys.argv[2], "w"), indent=2)
EOF
done

run() {  # name seq max_pred batch accumulation steps shards unpad extra-flags...
  local name=$1 seq=$2 pred=$3 batch=$4 acc=$5 steps=$6 shards=$7 unpad=$8; shift 8
  "$PYTHON" run_pretraining.py --do_train --input_dir "$work/hdf5_${shards}_$seq" --config_file "$work/config_$unpad.json" \
    --vocab_file "$data/bert-base-uncased-vocab.txt" --output_dir "$work/ckpt_$name" --max_seq_length "$seq" \
    --max_predictions_per_seq "$pred" --train_batch_size "$batch" --gradient_accumulation_steps "$acc" \
    --learning_rate 6e-3 --warmup_proportion 0.2843 --max_steps "$steps" --skip_checkpoint --log_freq 5 \
    --num_workers 4 --throughput_warmup_steps "$warmup" --disable_progress_bar --json-summary "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1 || { echo "$name FAILED"; tail -20 "$out/$name.log"; return 0; }
  echo "$name: $(grep FINAL "$out/$name.json" | tail -1)"
}
b1=${BENCH_BATCH1:-256} a1=${BENCH_ACC1:-2} s1=${BENCH_STEPS1:-25}
b2=${BENCH_BATCH2:-64} a2=${BENCH_ACC2:-4} s2=${BENCH_STEPS2:-15}
for mode in $modes; do
  flag=--no_compile; [[ $mode == compile ]] && flag=--compile
  for layout in padded unpadded packed; do
    case $layout in padded) shards=plain unpad=never ;; unpadded) shards=plain unpad=always ;; packed) shards=packed unpad=auto ;; esac
    run "phase1_${layout}_$mode" 128 20 "$b1" "$a1" "$s1" "$shards" "$unpad" --precision "$precision" "$flag"
    run "phase2_${layout}_$mode" 512 80 "$b2" "$a2" "$s2" "$shards" "$unpad" --precision "$precision" "$flag"
  done
done
[[ " $modes " == *" eager "* && ${BENCH_FP16:-1} == 1 ]] && run phase1_padded_fp16_eager 128 20 "$b1" "$a1" "$s1" plain never --fp16 --no_compile

"$PYTHON" - "$out" "$precision" <<'EOF'
import json, sys
from pathlib import Path

out, precision = Path(sys.argv[1]), sys.argv[2]
rows = []
for path in sorted(out.glob("phase*.json")):
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    final = next((r["data"] for r in records if r.get("step") == "FINAL"), None)
    phase, layout, *rest = path.stem.split("_")
    row = {"run": path.stem, "phase": int(phase[-1]), "layout": layout, "mode": rest[-1],
           "precision": "fp16" if "fp16" in rest else precision, "finished": final is not None}
    if final:
        row.update(rows_per_s=final["training_sequences_per_second"],
                   sequences_per_s=final["training_real_sequences_per_second"],
                   tokens_per_s=final["training_real_tokens_per_second"], mfu=final.get("mfu"),
                   peak_memory_gib=final.get("peak_memory_gib"))
    rows.append(row)
(out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
fmt = lambda x, f: "n/a" if x is None else format(x, f)
lines = ["| phase | layout | mode | precision | rows/s | sequences/s | real tokens/s | MFU | peak GiB |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    if not r["finished"]:
        lines.append(f"| {r['phase']} | {r['layout']} | {r['mode']} | {r['precision']} | failed (see {r['run']}.log) |"
                     " | | | |")
        continue
    lines.append(f"| {r['phase']} | {r['layout']} | {r['mode']} | {r['precision']} | {r['rows_per_s']:,.1f} | "
                 f"{r['sequences_per_s']:,.1f} | {r['tokens_per_s']:,.0f} | {fmt(r['mfu'] and 100 * r['mfu'], '.1f')}"
                 f"{'' if r['mfu'] is None else '%'} | {fmt(r['peak_memory_gib'], '.1f')} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
