#!/usr/bin/env bash
# One device call of issue 27, item 5 (bench/STUDIES.md, "Pre-training on one GPU"): pre-train with bench.gpu_study,
# then fine-tune the result and its random initialisation on MRPC and SST-2 on the same GPU, all inside the call's limit.
#
#   OUT=<folder> bash bench/gpu_study_call.sh     (on the GPU machine; .gpu_data/ carried beside the repository)
#
# .gpu_data/ (made here by `python -m bench.gpu_study prepare --out .gpu_data`, about 5 minutes on 2 cores) holds:
# text/ (the slice's training text shards, .txt.xz), eval/ (held-out HDF5), vocab.txt, the model configs (CONFIG),
# glue.tar.xz (glue-mrpc/ and glue-sst2/ with train.tsv and dev.tsv). What comes back in $OUT (the device tool returns
# at most 8 files of 16 MiB): gpu_study.json, the run's log, the bf16 weights split in 16 MB parts (BERT-mini: one;
# `cat weights.part* > <run>.bf16.safetensors`, then `python -m bench.gpu_study import`), ft.tar.xz (every
# fine-tuning's JSON and logs) and call.log. Environment overrides (a dry run on a CPU takes tiny values): BUDGET (s
# of pre-training), PROBE (steps), CAP (at most this many steps), BATCH, CONFIG, RUNS (the first is fine-tuned),
# EVAL_SAMPLES (held-out sequences, default 2048), DEADLINE (s from the start after which fine-tuning stops), SEEDS
# (of every fine-tuning, default 1,2,3,4,5), GPU_DATA (the folder, default .gpu_data), TEXT, WORK, TMP_ROOT, FT_EXTRA
# (more bench.pretrain_study flags), CKPTS (default 1; N: the run's weights after 1/N, 2/N, ... of its steps come back
# too, as <run>.step<S>.bf16.safetensors, where each fits one file: BERT-mini's 15.1 MB do, BERT-small's 43 MB do not;
# with BERT-mini, CKPTS=3 makes 7 of the 8 files the device tool returns, CKPTS=4 all 8). tests/test_gpu_study.py runs
# it so on a CPU.
#
# The fine-tuning: MRPC at lr 1e-4 and 2e-4 (3 epochs), and SST-2 on all 67,349 sentences for one epoch at 1e-4,
# pre-trained and random initialisation, every seed: the 5-seed form of the CPU's two-seed SST-2 column
# (bench/STUDIES.md, "BERT-small on one GPU"). 16 fine-tunings side by side ran there at about 1,056 sequences/s
# each, so one epoch of SST-2 is about 65 s of the call.
#
# The context probe of bench.pretrain_study (count models over 200,000 training sequences, on the CPU) runs once,
# in the MRPC fine-tuning at 1e-4; the other groups start at the same time with --no_context_probe: four probes at
# once, each beside 10 to 16 fine-tuning processes, take four of the call's minutes and leave too few for SST-2 on
# all its sentences (bench/STUDIES.md, "BERT-small on one GPU").
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?}
BUDGET=${BUDGET:-210}; PROBE=${PROBE:-200}; CAP=${CAP:-30000}; EVAL_SAMPLES=${EVAL_SAMPLES:-2048}
BATCH=${BATCH:-256}; DEADLINE=${DEADLINE:-545}; CKPTS=${CKPTS:-1}
D=${GPU_DATA:-.gpu_data}
CONFIG=${CONFIG:-$D/bert-small-16k.json}; RUNS=${RUNS:-adamw:1e-3}
FT_EXTRA=${FT_EXTRA:-}; WORK=${WORK:-/tmp/gs_work}; TMP=${TMP_ROOT:-/tmp/gs}; SEEDS=${SEEDS:-1,2,3,4,5}
NSEEDS=$(echo "$SEEDS" | tr ',' '\n' | wc -l)
LOG=$OUT/call.log
exec > >(tee -a "$LOG") 2>&1
name=${RUNS%%,*}; name=${name/:/_}
rm -rf "$TMP" "$WORK"; mkdir -p "$TMP/gs" "$TMP/glue"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
python3 -m bench.gpu_study run --text_dir "${TEXT:-$D/text}" --eval_dir "$D/eval" --vocab "$D/vocab.txt" \
    --config "$CONFIG" --out "$TMP/gs" --work "$WORK" --budget_s "$BUDGET" --probe_steps "$PROBE" \
    --max_steps_cap "$CAP" --eval_samples "$EVAL_SAMPLES" --checkpoints "$CKPTS" --batch "$BATCH" \
    --workers "$(nproc)" --runs "$RUNS" || { echo "gpu_study run failed"; exit 1; }
cp "$TMP/gs/gpu_study.json" "$TMP/gs/$name.log.json" "$OUT/"
split -b 16000000 -d "$TMP/gs/$name.bf16.safetensors" "$OUT/weights.part"  # the tool's 16 MiB a file
for f in "$TMP/gs/$name".step*.bf16.safetensors; do  # the earlier checkpoints (CKPTS > 1) that fit one file
    [ -e "$f" ] || continue
    if [ "$(stat -c %s "$f")" -le 16000000 ]; then cp "$f" "$OUT/"; else echo "not brought back (over 16 MB): $f"; fi
done
echo "stage pretrain done at ${SECONDS} s"
python3 -m bench.gpu_study import --from "$TMP/gs" --to "$TMP/runs" || exit 1
tar -xJf "$D/glue.tar.xz" -C "$TMP/glue"
finetune() {  # finetune OUTDIR LR TASKS MODELS SEEDS PARALLEL EXTRA... (in the background, ended at the deadline)
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 60 ]; then echo "skip $1: ${left} s left"; return; fi
    echo "stage finetune $1 (lr $2, $3, $4, seeds $5) with ${left} s left at ${SECONDS} s"
    ( timeout --signal=TERM "$left" python3 -m bench.pretrain_study --out "$TMP/ft/$1" --pretrain_run "$TMP/runs/$name" \
        --config "$CONFIG" --vocab "$D/vocab.txt" --models "$4" --data_root "$TMP/glue" --small_lr "$2" \
        --tasks "$3" --seeds "$5" --parallel "$6" --glue_threads 1 "${@:7}" $FT_EXTRA > "$TMP/ft_$1.txt" 2>&1
      echo "stage finetune $1 ended (exit $?) at ${SECONDS} s"; tail -n 4 "$TMP/ft_$1.txt" ) &
    PIDS+=($!)
}
PIDS=()  # a plain `wait` would also wait for the tee of the log: the children are waited for by their ids
pack() { tar -cJf "$OUT/ft.tar.xz" -C "$TMP" --exclude='*.pt' --exclude='*.safetensors' --exclude='hf_model' \
    ft $(cd "$TMP" && ls ft_*.txt) || true; }
SST2="--sst2_max_train_examples 67349 --sst2_epochs 1"
finetune mrpc_1e-4 1e-4 mrpc pretrained,random "$SEEDS" "$NSEEDS"
finetune sst2_full_1e-4_pre 1e-4 sst-2 pretrained "$SEEDS" "$NSEEDS" $SST2 --no_context_probe
finetune sst2_full_1e-4_rand 1e-4 sst-2 random "$SEEDS" "$NSEEDS" $SST2 --no_context_probe
finetune mrpc_2e-4 2e-4 mrpc pretrained,random "$SEEDS" "$NSEEDS" --no_context_probe
wait "${PIDS[@]}"; pack
echo "call done at ${SECONDS} s"
