#!/usr/bin/env bash
# Pre-train a small BERT on real text on the CPU, end to end, in a few minutes: the recipe's smallest real run, from
# raw text to a model that uses its context.
#
#   bash scripts/run_cpu_demo.sh                       # 25 files (4 M words) of ../shared/data/wikipedia-en-slice
#   bash scripts/run_cpu_demo.sh --corpus my_texts/    # any text: files, or folders of *.txt / *.gz / wiki_*
#   bash scripts/run_cpu_demo.sh --phase1_steps 50 --phase2_steps 5    # a quicker look (it will not learn much)
#   bash scripts/run_cpu_demo.sh --corpus reviews.txt --init_checkpoint results/cpu_demo/run_*/checkpoints/ckpt_4020.pt \
#     --vocab results/cpu_demo/vocab.txt --config results/cpu_demo/bert_config.json --out results/continued
#                                                      # continue pre-training a model on other text (domain- or
#                                                      # task-adaptive pre-training, Gururangan et al. 2020)
#
# Steps (everything under --out, default results/cpu_demo):
#   1. text -> one sentence per line, a blank line between documents (scripts/text_to_documents.py: WikiExtractor
#      output, WikiText or plain text; sentences split by bert_recipe/prep/sentence_segmentation.py); the last 5% of the
#      documents are held out;
#   2. a WordPiece vocabulary of --vocab_size pieces learned from the training text (data/create_vocab.py), unless
#      --vocab gives one; the model config (--config) gets that vocabulary's size (<out>/bert_config.json);
#   3. HDF5 shards with create_pretraining_data.py: phase 1 at sequence 64 with 30% of the tokens masked (20 slots),
#      the held-out set at sequence 64 with BERT's 15% (10 slots), phase 2 at sequence 512 (15%, 80 slots);
#   4. scripts/run_pretraining.sh with the `cpu` preset of scripts/configs/pretrain_config.sh (AdamW 1e-3, batch 32,
#      configs/bert-small-cpu.json), a constant learning rate after the warm-up, phase 1 then phase 2, evaluating the
#      held-out set every 500 steps of phase 1;
#   5. a summary: masked-LM loss at the start and at the end, and whether the model learned from context: held-out
#      loss against the word-frequency entropy, the context gain, and always guessing the commonest word.
# Why these choices (bench/STUDIES.md, "How the recipe was found"): a small vocabulary makes the output layer, most
# of a 2-layer model's step, 4x cheaper; 30% masking gives twice the predictions a sequence; sequence 64 takes half
# the time a step of 128 does, and at 128 the model had not left the word-frequency plateau after 3,000 steps where
# at 64 it left it at about 2,500; a learning rate that stays high (no decay) is what lets it leave (the same run
# decayed over 3,000 steps stayed there); WikiText-2 is too small (the model overfits it before it uses the context).
#
# Options: --corpus PATH (repeatable; default ../shared/data/wikipedia-en-slice/text/AA/wiki_00.gz .. wiki_24.gz),
# --vocab FILE (an existing vocabulary, e.g. bert-base-uncased's; default: learn one; also $VOCAB_FILE),
# --vocab_size N (the learned vocabulary's size; default 8000), --out DIR, --phase1_steps N, --phase2_steps N,
# --config FILE (model; default configs/bert-small-cpu.json; its vocab_size is set to the vocabulary's), --batch N
# and --lr X (phase 1's sequences per optimizer step per process and peak learning rate; default 32 and 1e-3; phase 2
# gets half of --lr, as in the preset), --optimizer nvlamb|adamw (default adamw, the preset's), --processes N (CPU
# processes with gloo, each with --batch: N x batch sequences a step; default 1), --dupe_factor N (phase 1 shards;
# default 1), --init_checkpoint FILE (phase 1 starts from these weights instead of a random initialisation, with a
# fresh optimizer: a ckpt_<step>.pt, an NVIDIA .pt or a Hugging Face folder; needs --vocab, the model's own
# vocabulary, and --config, its shape), -h. Environment: PYTHON (default .venv/bin/python if present, else
# python3), OMP_NUM_THREADS (default: torch's; 1 when the machine is busy, i.e. the load average is at least the
# number of cores: on a shared 2-core machine two OpenMP threads stall whenever one is descheduled, measured 4x
# slower than one thread).
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
dupe_factor=1
vocab_size=8000
init_checkpoint=""
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --corpus) [[ $# -ge 2 ]] || die "--corpus needs a path"; corpus+=("$2"); shift 2 ;;
    --vocab) [[ $# -ge 2 ]] || die "--vocab needs a file"; vocab="$2"; shift 2 ;;
    --vocab_size) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--vocab_size needs a positive integer"
                  vocab_size="$2"; shift 2 ;;
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
    --init_checkpoint) [[ $# -ge 2 ]] || die "--init_checkpoint needs a checkpoint"; init_checkpoint="$2"; shift 2 ;;
    *) die "unknown option '$1' (see -h)" ;;
  esac
done

if (( ${#corpus[@]} == 0 )); then
  slice="$shared/wikipedia-en-slice/text/AA"
  [[ -f "$slice/wiki_24.gz" ]] || die "no corpus: $slice/wiki_00.gz .. wiki_24.gz are absent (../shared/data); pass" \
    "--corpus FILE_OR_DIR to pre-train on any text"
  corpus=("$slice"/wiki_{00..24}.gz)
fi
[[ -z "$vocab" || -f "$vocab" ]] || die "vocabulary $vocab not found (--vocab)"
if [[ -n "$init_checkpoint" ]]; then
  [[ -e "$init_checkpoint" ]] || die "checkpoint $init_checkpoint not found (--init_checkpoint)"
  # A vocabulary learned from the new text would not match the checkpoint's embeddings, nor the default config
  # its shape: both must be the model's own.
  [[ -n "$vocab" ]] || die "--init_checkpoint needs --vocab: the vocabulary the checkpoint was trained with"
  [[ -n "$config" ]] || die "--init_checkpoint needs --config: the checkpoint's model config (its bert_config.json)"
fi
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

# Phase 1's shards: sequence $p1_seq with $p1_mask of the tokens masked (up to $p1_pred slots); the held-out set is
# scored with BERT's own 15% at the same length.
p1_seq=64 p1_pred=20 p1_mask=0.3 eval_pred=10

# ---- 1. text ----------------------------------------------------------------------------------------------------
echo "== 1/4 text -> sentences (${#corpus[@]} input(s): ${corpus[0]}$( (( ${#corpus[@]} > 1 )) && echo " ..."))"
"$PYTHON" -m scripts.text_to_documents --input "${corpus[@]}" --sentences --test_fraction 0.05 \
  --output "$out/text/train.txt" --test_output "$out/text/heldout.txt"

# ---- 2. vocabulary and model config ------------------------------------------------------------------------------
if [[ -z "$vocab" ]]; then
  echo "== 2/4 a WordPiece vocabulary of $vocab_size pieces learned from the training text (data/create_vocab.py)"
  "$PYTHON" -m data.create_vocab --input "$out/text/train.txt" --output_file "$out/vocab.txt" \
    --vocab_size "$vocab_size" --no_progress
  vocab="$out/vocab.txt"
else
  echo "== 2/4 vocabulary $vocab (--vocab)"
fi
config_src="${config:-$repo/configs/bert-small-cpu.json}"
# The model's vocab_size follows the vocabulary: kept when it already fits (tokenization.vocab_fits_config, the rule
# run_pretraining.py checks: bert-base-uncased's 30522 stays 30522), else create_vocab's padding to a multiple of 8.
(cd "$repo" && "$PYTHON" -m scripts.cpu_demo --prog run_cpu_demo.sh config "$config_src" "$vocab" "$out/bert_config.json")

# ---- 3. HDF5 shards ---------------------------------------------------------------------------------------------
echo "== 3/4 HDF5 shards (create_pretraining_data.py)"
make_shards() {  # input output seq max_pred masked_lm_prob dupe
  "$PYTHON" "$repo/create_pretraining_data.py" --input_file "$1" --output_file "$2" --vocab_file "$vocab" \
    --do_lower_case --max_seq_length "$3" --max_predictions_per_seq "$4" --masked_lm_prob "$5" \
    --dupe_factor "$6" --random_seed 12345 --num_workers 2 --no_progress
}
make_shards "$out/text/train.txt" "$out/hdf5_phase1/train.hdf5" "$p1_seq" "$p1_pred" "$p1_mask" "$dupe_factor"
make_shards "$out/text/heldout.txt" "$out/hdf5_heldout/heldout.hdf5" "$p1_seq" "$eval_pred" 0.15 1
make_shards "$out/text/train.txt" "$out/hdf5_seq512/train.hdf5" 512 80 0.15 1

# ---- 4. pre-training --------------------------------------------------------------------------------------------
# shellcheck source=configs/pretrain_config.sh
source "$repo/scripts/configs/pretrain_config.sh"
args=($(CPU_DEMO_DIR="$out" cpu))
set_arg() { args[$(pretrain_slot "$1")]=$2; }  # the cpu preset's launcher arguments, changed by name
[[ -n "$phase1_steps" ]] && set_arg train_steps "$phase1_steps"
[[ -n "$phase2_steps" ]] && set_arg train_steps_phase2 "$phase2_steps"
[[ -n "$batch" ]] && set_arg train_batch_size "$batch"
[[ -n "$lr" ]] && { set_arg learning_rate "$lr"
                    set_arg learning_rate_phase2 "$(awk -v x="$lr" 'BEGIN { printf "%g", x / 2 }')"; }
[[ -n "$processes" ]] && set_arg num_gpus "$processes"
[[ -n "$optimizer" ]] && set_arg optimizer "$optimizer"
set_arg BERT_CONFIG "$out/bert_config.json"
[[ -n "$init_checkpoint" ]] && \
  set_arg init_checkpoint "$(cd "$(dirname "$init_checkpoint")" && pwd)/$(basename "$init_checkpoint")"
arg() { echo "${args[$(pretrain_slot "$1")]}"; }
run_dir="$out/run_$(date +%y%m%d_%H%M%S)"
export RESULTS_DIR="$run_dir" CHECKPOINTS_DIR="$run_dir/checkpoints"
export EVAL_DIR_PHASE1="$out/hdf5_heldout" VOCAB_FILE="$vocab"
export MAX_SEQ_LENGTH_PHASE1="$p1_seq" MAX_PRED_PHASE1="$p1_pred"
# --mlm_bias_init unigram: the output bias starts at the log word frequencies, so the steps go to learning from
# context instead of to learning word frequencies first (bench/STUDIES.md; phase 2 keeps phase 1's).
# --lr_schedule constant: the model leaves the word-frequency plateau only while the rate is high; a rate decayed
# over the demo's few thousand steps keeps it there (the same page, runs C and F).
export EXTRA_ARGS="--log_freq 10 --num_workers 1 --eval_steps 500 --max_eval_samples 2000 --mlm_bias_init unigram \
--lr_schedule constant"
echo "== 4/4 pre-training: phase 1 $(arg train_steps) steps (seq $p1_seq), phase 2 $(arg train_steps_phase2) steps (seq 512); logs in $run_dir"
# shellcheck source=signals.sh
source "$repo/scripts/signals.sh"  # a stop signal to this script reaches the launcher and the training process
run_forwarding_signals "" bash "$repo/scripts/run_pretraining.sh" "${args[@]}"
(( JOB_STATUS == 0 )) || exit "$JOB_STATUS"  # 75: stopped by a signal (the launcher said how to resume)

# ---- 4. summary -------------------------------------------------------------------------------------------------
(cd "$repo" && "$PYTHON" -m scripts.cpu_demo --prog run_cpu_demo.sh summary "$run_dir" --job "$(arg job_name)" \
  --heldout "$out/hdf5_heldout/heldout.hdf5" --max_eval 2000 --train_shard "$out/hdf5_phase1/train.hdf5" --vocab "$vocab")
echo "logs (JSON lines, and the console output): $run_dir"
echo "checkpoints: $run_dir/checkpoints"
