#!/usr/bin/env bash
# From nothing to phase 1 and phase 2 HDF5 shards in one call: download -> text_formatting (-> create_vocab) ->
# sharding -> create_hdf5_files (seq 128 / 20 predictions, then seq 512 / 80 predictions), as NVIDIA's script of the
# same name.
#
# Usage: data/create_datasets_from_start.sh [DATASET] [DATA_DIR]
#   DATASET   wiki_only (default, = wikicorpus_en) | wiki_books (= books_wiki_en_corpus) | custom
#   DATA_DIR  the working folder (default: $DATA_DIR, else $BERT_PREP_WORKING_DIR, else ./bert_data)
# Environment (all optional):
#   DUMP_DATE=latest|YYYYMMDD   WIKI_BASE_URL=https://dumps.wikimedia.org
#   DUMP_KIND=multistream|single: the multistream dump with its index (default: formatted in pieces, in parallel,
#     on every engine) or the single-stream one (one reader)
#   WIKIEXTRACTOR_DIR=folder of WikiExtractor output (wiki_* files, also .gz/.bz2): format it instead of
#                     downloading and parsing a dump (wiki_only, wiki_books)
#   BOOKS_DIR=folder of .txt books, or BOOKS_URL_LIST=file of URLs       (wiki_books)
#   INPUT_DIR=folder of .txt files, DOC_BOUNDARY=file|blank_line|line    (custom)
#   INPUT_FORMAT=parquet TEXT_COLUMN=text: INPUT_DIR holds Parquet files (a document per row, read by row group)
#   INPUT_PATTERN=the files of INPUT_DIR (default *.txt, or *.parquet)
#   ENGINE=processes|dask: where the stages run their tasks (bert_recipe/prep/engine.py; the shards are the same bytes either
#     way). dask without DASK_SCHEDULER_FILE: each stage starts a local cluster of N_PROCESSES workers; with it,
#     the stages join that running cluster (sbatch data/prep.sub starts one over the job's nodes and runs this)
#   VOCAB_FILE=vocab.txt (default: downloads Google's uncased BERT-Large zip for its vocab.txt)
#   VOCAB_SIZE=16000 instead: learns $DATA_DIR/vocab.txt of that many entries from the formatted text (Google's
#     layout, data/create_vocab.py) and makes the shards with it; a model config for it has vocab_size VOCAB_SIZE
#     rounded up to a multiple of 8. UNUSED_SLOTS, LIMIT_ALPHABET: its optional --unused_slots / --limit_alphabet
#   DO_LOWER_CASE=1  N_PROCESSES=$(nproc)  N_TRAINING_SHARDS=256  N_TEST_SHARDS=256  FRACTION_TEST_SET=0.2
#   DUPE_FACTOR=5  RANDOM_SEED=12345  PYTHON=<the checkout's .venv/bin/python if present, else python3>
# Rerunning keeps finished downloads (verified) and computes only what is missing: every stage lists its outputs
# (rows, sha256, the settings that made them) in a manifest beside them, and reuses the ones that still match.
set -euo pipefail

dataset_arg=${1:-wiki_only}
export BERT_PREP_WORKING_DIR=${2:-${DATA_DIR:-${BERT_PREP_WORKING_DIR:-$PWD/bert_data}}}
case "$dataset_arg" in
  wiki_only|wikicorpus_en) DATASET=wikicorpus_en ;;
  wiki_books|books_wiki_en_corpus) DATASET=books_wiki_en_corpus ;;
  custom) DATASET=custom ;;
  *) echo "error: unknown dataset '$dataset_arg' (wiki_only | wiki_books | custom)" >&2; exit 2 ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The checkout's .venv (scripts/setup_cpu.sh) when there is one, as the launchers and data/prep.sub choose.
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  [[ -x "$repo/.venv/bin/python" ]] && PYTHON="$repo/.venv/bin/python"
fi
# Refused now rather than after the download: a learned vocabulary must not overwrite a given one.
if [[ -n "${VOCAB_SIZE:-}" ]]; then
  if [[ -n "${VOCAB_FILE:-}" ]]; then
    echo "error: set VOCAB_SIZE (learn a vocabulary from the text) or VOCAB_FILE (use that one), not both" >&2; exit 2
  fi
  if ! [[ "$VOCAB_SIZE" =~ ^[0-9]+$ ]]; then
    echo "error: VOCAB_SIZE must be a whole number of entries (e.g. 16000), got '$VOCAB_SIZE'" >&2; exit 2
  fi
fi
cd "$repo"  # the repository root: bertPrep runs as a module from there
PREP=("$PYTHON" -m data.bertPrep --working_dir "$BERT_PREP_WORKING_DIR" --n_processes "${N_PROCESSES:-$(nproc)}"
      --random_seed "${RANDOM_SEED:-12345}")
ENGINE_ARGS=(--engine "${ENGINE:-processes}")
[[ -n "${DASK_SCHEDULER_FILE:-}" ]] && ENGINE_ARGS+=(--dask_scheduler_file "$DASK_SCHEDULER_FILE")
SHARDS=(--n_training_shards "${N_TRAINING_SHARDS:-256}" --n_test_shards "${N_TEST_SHARDS:-256}"
        --fraction_test_set "${FRACTION_TEST_SET:-0.2}")
BOOKS=()
[[ -n "${BOOKS_DIR:-}" ]] && BOOKS+=(--books_dir "$BOOKS_DIR")
[[ -n "${BOOKS_URL_LIST:-}" ]] && BOOKS+=(--books_url_list "$BOOKS_URL_LIST")
CUSTOM=(--input_dir "${INPUT_DIR:-}" --doc_boundary "${DOC_BOUNDARY:-file}" --input_format "${INPUT_FORMAT:-text}"
        --text_column "${TEXT_COLUMN:-text}")
[[ -n "${INPUT_PATTERN:-}" ]] && CUSTOM+=(--input_pattern "$INPUT_PATTERN")
echo "dataset $DATASET, working dir $BERT_PREP_WORKING_DIR, engine ${ENGINE:-processes}"

# 1. Download (verified, resumable) and 2. format into one document per line.
case "$DATASET" in
  wikicorpus_en|books_wiki_en_corpus)
    if [[ -n "${WIKIEXTRACTOR_DIR:-}" ]]; then  # already extracted: format it, nothing to download
      "${PREP[@]}" "${ENGINE_ARGS[@]}" --action text_formatting --dataset wikicorpus_en \
        --wikiextractor_dir "$WIKIEXTRACTOR_DIR"
    else
      "${PREP[@]}" --action download --dataset wikicorpus_en --dump_date "${DUMP_DATE:-latest}" \
        --base_url "${WIKI_BASE_URL:-https://dumps.wikimedia.org}" --wiki_dump_kind "${DUMP_KIND:-multistream}"
      "${PREP[@]}" "${ENGINE_ARGS[@]}" --action text_formatting --dataset wikicorpus_en
    fi ;;
esac
if [[ "$DATASET" == books_wiki_en_corpus ]]; then
  "${PREP[@]}" --action download --dataset bookscorpus "${BOOKS[@]}"
  "${PREP[@]}" "${ENGINE_ARGS[@]}" --action text_formatting --dataset bookscorpus "${BOOKS[@]}"
fi
if [[ "$DATASET" == custom ]]; then
  "${PREP[@]}" --action download --dataset custom "${CUSTOM[@]}"
  "${PREP[@]}" "${ENGINE_ARGS[@]}" --action text_formatting --dataset custom "${CUSTOM[@]}"
fi

if [[ -n "${VOCAB_SIZE:-}" ]]; then
  # 2b. Your own vocabulary, from all the formatted text (before sharding: the test shards are held out from
  # pre-training, not from the vocabulary, as with Google's).
  VOCAB_FILE=$BERT_PREP_WORKING_DIR/vocab.txt
  VOCAB_ARGS=(--vocab_size "$VOCAB_SIZE")
  [[ -n "${UNUSED_SLOTS:-}" ]] && VOCAB_ARGS+=(--unused_slots "$UNUSED_SLOTS")
  [[ -n "${LIMIT_ALPHABET:-}" ]] && VOCAB_ARGS+=(--limit_alphabet "$LIMIT_ALPHABET")
  "${PREP[@]}" "${ENGINE_ARGS[@]}" --action create_vocab --dataset "$DATASET" --vocab_file "$VOCAB_FILE" \
    "${VOCAB_ARGS[@]}" \
    --do_lower_case "${DO_LOWER_CASE:-1}"
elif [[ -z "${VOCAB_FILE:-}" ]]; then
  "${PREP[@]}" --action download --dataset google_pretrained_weights
  VOCAB_FILE=$BERT_PREP_WORKING_DIR/download/google_pretrained_weights/uncased_L-24_H-1024_A-16/vocab.txt
fi

# 3. Sentence segmentation and sharding.
"${PREP[@]}" "${ENGINE_ARGS[@]}" --action sharding --dataset "$DATASET" "${SHARDS[@]}"

# 4. HDF5: phase 1 (seq 128, 20 predictions) and phase 2 (seq 512, 80 predictions).
for phase in 1 2; do
  "${PREP[@]}" "${ENGINE_ARGS[@]}" --action create_hdf5_files --dataset "$DATASET" "${SHARDS[@]}" --phase "$phase" \
    --vocab_file "$VOCAB_FILE" --do_lower_case "${DO_LOWER_CASE:-1}" --dupe_factor "${DUPE_FACTOR:-5}" \
    --masked_lm_prob 0.15 --short_seq_prob 0.1
done
echo "done: HDF5 shards under $BERT_PREP_WORKING_DIR/hdf5_lower_case_*/$DATASET/{training,test}, made with $VOCAB_FILE"
