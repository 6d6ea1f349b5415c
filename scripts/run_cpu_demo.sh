#!/usr/bin/env bash
# Pre-train a small BERT on real text on the CPU, end to end, in a few minutes: the recipe's smallest real run.
#
#   bash scripts/run_cpu_demo.sh                       # WikiText-2 from ../shared/data
#   bash scripts/run_cpu_demo.sh --corpus my_texts/    # any text: files, or folders of *.txt
#   bash scripts/run_cpu_demo.sh --phase1_steps 50 --phase2_steps 5    # a quicker look
#
# Steps (everything under --out, default results/cpu_demo):
#   1. text -> one sentence per line, a blank line between documents (scripts/text_to_documents.py, which splits
#      sentences with data/sentence_segmentation.py); the last 5% of the documents are held out;
#   2. HDF5 shards with create_pretraining_data.py and the uncased BERT vocabulary: sequence 128 (phase 1, and the
#      held-out set) and 512 (phase 2);
#   3. scripts/run_pretraining.sh with the `cpu` preset of scripts/configs/pretrain_config.sh (configs/bert-small-cpu.json),
#      phase 1 then phase 2, evaluating held-out masked-LM accuracy during phase 1;
#   4. a summary: masked-LM loss at the start and at the end, held-out accuracy, where logs and checkpoints are.
#
# Options: --corpus PATH (repeatable; default ../shared/data/wikitext-2/{valid,test}.txt), --vocab FILE (default
# ../shared/data/bert-vocab/bert-base-uncased-vocab.txt, or $VOCAB_FILE), --out DIR, --phase1_steps N,
# --phase2_steps N, --config FILE (model; default configs/bert-small-cpu.json), --batch N and --lr X (phase 1's
# sequences per optimizer step per process and peak learning rate; default 32 and 1e-2; phase 2 gets half of --lr,
# as in the preset), --optimizer nvlamb|adamw (default nvlamb, the preset's), --processes N (CPU
# processes with gloo, each with --batch: N x batch sequences a step; default 1), --dupe_factor N (phase 1 shards;
# default 3), -h. Environment: PYTHON (default .venv/bin/python if present, else python3), OMP_NUM_THREADS
# (default: torch's; 1 when the machine is busy, i.e. the load average is at least the number of cores: on a shared
# 2-core machine two OpenMP threads stall whenever one is descheduled, measured 4x slower than one thread).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "run_cpu_demo.sh: $*" >&2; exit 1; }

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="$(dirname "$repo")/shared/data"
corpus=()
vocab="${VOCAB_FILE:-}"
out="$repo/results/cpu_demo"
phase1_steps=""
phase2_steps=""
config=""
batch=""
lr=""
processes=""
optimizer=""
dupe_factor=3
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --corpus) [[ $# -ge 2 ]] || die "--corpus needs a path"; corpus+=("$2"); shift 2 ;;
    --vocab) [[ $# -ge 2 ]] || die "--vocab needs a file"; vocab="$2"; shift 2 ;;
    --out) [[ $# -ge 2 ]] || die "--out needs a folder"; out="$2"; shift 2 ;;
    --phase1_steps) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--phase1_steps needs a positive integer"
                    phase1_steps="$2"; shift 2 ;;
    --phase2_steps) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--phase2_steps needs a positive integer"
                    phase2_steps="$2"; shift 2 ;;
    --config) [[ $# -ge 2 && -f "$2" ]] || die "--config needs an existing BERT config JSON file"; config="$2"; shift 2 ;;
    --batch) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--batch needs a positive integer"; batch="$2"; shift 2 ;;
    --lr) [[ "${2:-}" =~ ^[0-9.]+([eE]-?[0-9]+)?$ ]] || die "--lr needs a positive number"; lr="$2"; shift 2 ;;
    --optimizer) [[ "${2:-}" =~ ^(adamw|nvlamb)$ ]] || die "--optimizer needs adamw or nvlamb"; optimizer="$2"; shift 2 ;;
    --processes) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--processes needs a positive integer"; processes="$2"; shift 2 ;;
    --dupe_factor) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--dupe_factor needs a positive integer"
                   dupe_factor="$2"; shift 2 ;;
    *) die "unknown option '$1' (see -h)" ;;
  esac
done

if (( ${#corpus[@]} == 0 )); then
  [[ -d "$shared/wikitext-2" ]] || die "no corpus: $shared/wikitext-2 is absent; pass --corpus FILE_OR_DIR to pre-train on any text"
  corpus=("$shared/wikitext-2/valid.txt" "$shared/wikitext-2/test.txt")
fi
if [[ -z "$vocab" ]]; then
  vocab="$shared/bert-vocab/bert-base-uncased-vocab.txt"
  [[ -f "$vocab" ]] || die "no vocabulary: $vocab is absent; pass --vocab with a BERT uncased vocab.txt"
fi
[[ -f "$vocab" ]] || die "vocabulary $vocab not found (--vocab)"
for path in "${corpus[@]}"; do
  [[ -e "$path" ]] || die "corpus $path not found (--corpus)"
done
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  [[ -x "$repo/.venv/bin/python" ]] && PYTHON="$repo/.venv/bin/python"
fi
export PYTHON
cores=$(nproc)  # before OMP_NUM_THREADS is set: nproc honours it
if [[ -z "${OMP_NUM_THREADS:-}" ]] && awk -v n="$cores" '{ exit !($1 >= n) }' /proc/loadavg 2> /dev/null; then
  export OMP_NUM_THREADS=1
  echo "run_cpu_demo.sh: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg) on $cores cores): one thread" \
       "(OMP_NUM_THREADS=1) avoids OpenMP stalls; set OMP_NUM_THREADS to choose"
fi
cd "$repo"  # the helpers are modules of this repository (python -m scripts.text_to_documents)
mkdir -p "$out"
out="$(cd "$out" && pwd)"

# ---- 1. text ----------------------------------------------------------------------------------------------------
echo "== 1/3 text -> sentences ($(printf '%s ' "${corpus[@]}"))"
"$PYTHON" -m scripts.text_to_documents --input "${corpus[@]}" --sentences --test_fraction 0.05 \
  --output "$out/text/train.txt" --test_output "$out/text/heldout.txt"

# ---- 2. HDF5 shards ---------------------------------------------------------------------------------------------
echo "== 2/3 HDF5 shards (create_pretraining_data.py)"
make_shards() {  # input output seq max_pred dupe
  "$PYTHON" "$repo/create_pretraining_data.py" --input_file "$1" --output_file "$2" --vocab_file "$vocab" \
    --do_lower_case --max_seq_length "$3" --max_predictions_per_seq "$4" --masked_lm_prob 0.15 \
    --dupe_factor "$5" --random_seed 12345 --num_workers 2 --no_progress
}
make_shards "$out/text/train.txt" "$out/hdf5_seq128/train.hdf5" 128 20 "$dupe_factor"
make_shards "$out/text/heldout.txt" "$out/hdf5_heldout128/heldout.hdf5" 128 20 1
make_shards "$out/text/train.txt" "$out/hdf5_seq512/train.hdf5" 512 80 1

# ---- 3. pre-training --------------------------------------------------------------------------------------------
# shellcheck source=configs/pretrain_config.sh
source "$repo/scripts/configs/pretrain_config.sh"
args=($(CPU_DEMO_DIR="$out" cpu))
[[ -n "$phase1_steps" ]] && args[5]=$phase1_steps
[[ -n "$phase2_steps" ]] && args[18]=$phase2_steps
[[ -n "$batch" ]] && args[0]=$batch
[[ -n "$lr" ]] && { args[1]=$lr; args[16]=$(awk -v x="$lr" 'BEGIN { printf "%g", x / 2 }'); }
[[ -n "$processes" ]] && args[3]=$processes
[[ -n "$optimizer" ]] && args[25]=$optimizer
[[ -n "$config" ]] && args[24]="$(cd "$(dirname "$config")" && pwd)/$(basename "$config")"
run_dir="$out/run_$(date +%y%m%d_%H%M%S)"
export RESULTS_DIR="$run_dir" CHECKPOINTS_DIR="$run_dir/checkpoints"
export EVAL_DIR_PHASE1="$out/hdf5_heldout128"
# --mlm_bias_init unigram: the output bias starts at the log word frequencies, so the few hundred steps go to
# learning from context instead of to learning word frequencies first (measured in README; phase 2 keeps phase 1's).
export EXTRA_ARGS="--log_freq 10 --num_workers 1 --eval_steps 100 --max_eval_samples 2000 --mlm_bias_init unigram"
echo "== 3/3 pre-training: phase 1 ${args[5]} steps (seq 128), phase 2 ${args[18]} steps (seq 512); logs in $run_dir"
# shellcheck source=signals.sh
source "$repo/scripts/signals.sh"  # a stop signal to this script reaches the launcher and the training process
run_forwarding_signals "" bash "$repo/scripts/run_pretraining.sh" "${args[@]}"
(( JOB_STATUS == 0 )) || exit "$JOB_STATUS"  # 75: stopped by a signal (the launcher said how to resume)

# ---- 4. summary -------------------------------------------------------------------------------------------------
"$PYTHON" - "$run_dir" "${args[12]}" "$out/hdf5_heldout128/heldout.hdf5" 2000 "$out/hdf5_seq128/train.hdf5" \
  "$vocab" <<'EOF'
import json, sys
from pathlib import Path

import h5py
import numpy as np

run_dir, job, heldout, max_eval = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
train_shard, vocab_file = sys.argv[5], sys.argv[6]
# The baseline to beat: always guess the held-out set's most frequent masked token (what the eval counts: the
# first --max_eval_samples samples, masked slots with a position > 0).
with h5py.File(heldout, "r") as f:
    positions, ids = f["masked_lm_positions"][:max_eval], f["masked_lm_ids"][:max_eval]
targets = ids[positions > 0]
baseline = np.bincount(targets).max() / len(targets)
# A second context-free reference: a unigram model of the training shard (add-one smoothed, the prior that
# --mlm_bias_init unigram starts from) scored on the same held-out targets. The held-out words' own entropy is
# optimistic on a set this small (a few thousand targets: rare words seen once look certain).
from pretraining_data import unigram_log_prior

with open(vocab_file, encoding="utf-8") as f:
    vocab_size = sum(1 for _ in f)
train_unigram = float(-unigram_log_prior(train_shard, vocab_size).numpy()[targets].mean())
print(f"baseline: always guessing the most frequent masked token scores {baseline:.3f} on the held-out set")
learned = None
for phase in (1, 2):
    path = run_dir / f"{job}.phase{phase}.json"
    if not path.is_file():
        continue
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [(r["step"], r["data"]["mlm_loss"]) for r in records if isinstance(r["step"], int) and "mlm_loss" in r["data"]]
    evals = [(r["step"], r["data"]) for r in records if "eval_mlm_accuracy" in r.get("data", {})]
    final = next((r["data"] for r in reversed(records) if r["step"] == "FINAL"), {})
    line = f"phase {phase}:"
    if losses:
        line += f" masked-LM loss {losses[0][1]:.3f} (step {losses[0][0]}) -> {losses[-1][1]:.3f} (step {losses[-1][0]})"
    if evals:
        line += f"; held-out masked-LM accuracy {evals[0][1]['eval_mlm_accuracy']:.3f} -> {evals[-1][1]['eval_mlm_accuracy']:.3f}"
    if "training_sequences_per_second" in final:
        line += f"; {final['training_sequences_per_second']:.1f} sequences/s"
    print(line)
    if evals and "eval_context_gain" in evals[-1][1]:
        learned = (phase, *evals[-1])
if learned:
    # Did it learn from context? The held-out loss against the best context-free guess (the held-out targets' own
    # word frequencies), and what the context is worth on the [MASK]ed slots (validation.py).
    phase, step, e = learned
    below = e["eval_unigram_entropy"] - e["eval_mlm_loss"]
    print(f"learned? phase {phase}, step {step}: held-out masked-LM loss {e['eval_mlm_loss']:.3f} nats against "
          f"{e['eval_unigram_entropy']:.3f} for guessing from word frequencies alone ({abs(below):.3f} nats "
          f"{'better' if below > 0 else 'worse'}; those are the {len(targets)} held-out targets' own frequencies, an "
          f"optimistic reference on a set this small)")
    gain = train_unigram - e["eval_mlm_loss"]
    print(f"learned? phase {phase}, step {step}: against a unigram model of the training shard ({train_unigram:.3f} "
          f"nats on the same targets): {abs(gain):.3f} nats {'better' if gain > 0 else 'worse'}")
    print(f"learned? phase {phase}, step {step}: context gain {100 * e['eval_context_gain']:+.1f} points: "
          f"{e['eval_mask_accuracy']:.3f} of the [MASK]ed held-out words right with their context, "
          f"{e['eval_mask_accuracy_without_context']:.3f} with every other word hidden too")
    commonest = e.get("eval_mask_accuracy_most_frequent")
    if commonest is not None:
        print(f"learned? phase {phase}, step {step}: always guessing the commonest of those words scores "
              f"{commonest:.3f}" + (": with the context the model does no better, so the gain is its guesses without "
              "context getting worse (a row of [MASK]s is unlike its training), not a use of the context"
              if e["eval_context_gain"] > 0 and e["eval_mask_accuracy"] <= commonest else ""))
EOF
echo "logs (JSON lines, and the console output): $run_dir"
echo "checkpoints: $run_dir/checkpoints"
