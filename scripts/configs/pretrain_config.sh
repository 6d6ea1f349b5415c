#!/usr/bin/env bash
# Pre-training presets: each function echoes the 25 positional arguments of scripts/run_pretraining.sh (NVIDIA's),
# and the small ones (cpu, small_1gpu_bf16) a 26th, the optimizer.
#
#   source scripts/configs/pretrain_config.sh
#   bash scripts/run_pretraining.sh $(dgxa100-80g_8gpu_bf16)
#
# Argument 1 (and 16) is the batch per GPU per optimizer step, all micro-batches together, as in NVIDIA's
# HDF5-era scripts; micro-batch = argument 1 / argument 11. Every GPU preset trains with NVIDIA's published global
# batch, 65536 sequences in phase 1 (seq 128) and 32768 in phase 2 (seq 512), for 7038 + 1563 steps; what differs
# per machine is how a GPU's share is cut into micro-batches that fit in its memory. The DGX-1, DGX-2 and DGX A100
# values are NVIDIA DeepLearningExamples' (scripts/configs/pretrain_config.sh; the A100 80 GB ones from its later
# micro-batch form, converted: 256 x 32 = 8192). The H100 and bf16 presets are ours (see each one's comment).
# Data folders follow data/bertPrep.py's naming under $BERT_PREP_WORKING_DIR (the Dockerfile and
# scripts/docker/launch.sh set /workspace/data); CODEDIR is /workspace/bert, where the Dockerfile puts the code.
# Sourcing this file only defines functions and three variables; it runs nothing. A preset's output is changed by
# name, not by position: args=($(cpu)); args[$(pretrain_slot train_steps)]=2000 (scripts/run_cpu_demo.sh does).

_pretrain_prep_dir="${BERT_PREP_WORKING_DIR:-/workspace/data}"
_pretrain_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# _pretrain_echo ARG1..ARG20: appends the data folders, CODEDIR, init_checkpoint and BERT_CONFIG of the GPU presets.
_pretrain_echo() {
  local p1="$_pretrain_prep_dir/hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training/"
  local p2="$_pretrain_prep_dir/hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training/"
  echo "$@" "$p1" "$p2" /workspace/bert None /workspace/bert/bert_config.json
}

# Arguments 1-20, in order:
#   batch lr precision gpus warmup steps save resume logfile accumulate accum_steps seed job
#   allreduce_post allreduce_fp16 batch2 lr2 warmup2 steps2 accum_steps2

# ---- NVIDIA DGX-1 (8x V100 16 GB) --------------------------------------------------------------------------
dgx1_8gpu_fp16() {
  _pretrain_echo 8192 6e-3 fp16 8 0.2843 7038 200 false true true 512 42 bert_lamb_pretraining true true \
                 4096 4e-3 0.128 1563 512
}
dgx1_8gpu_fp32() {
  _pretrain_echo 8192 6e-3 fp32 8 0.2843 7038 200 false true true 1024 42 bert_lamb_pretraining true false \
                 4096 4e-3 0.128 1563 1024
}

# ---- NVIDIA DGX-2H (16x V100 32 GB): half the per-GPU batch, same global batch ------------------------------
dgx2_16gpu_fp16() {
  _pretrain_echo 4096 6e-3 fp16 16 0.2843 7038 200 false true true 64 42 bert_lamb_pretraining true true \
                 2048 4e-3 0.128 1563 128
}
dgx2_16gpu_fp32() {
  _pretrain_echo 4096 6e-3 fp32 16 0.2843 7038 200 false true true 128 42 bert_lamb_pretraining true false \
                 2048 4e-3 0.128 1563 256
}

# ---- NVIDIA DGX A100 40 GB (8x A100) -------------------------------------------------------------------------
dgxa100-40g_8gpu_fp16() {
  _pretrain_echo 8192 6e-3 fp16 8 0.2843 7038 200 false true true 128 42 bert_lamb_pretraining true true \
                 4096 4e-3 0.128 1563 256
}
dgxa100-40g_8gpu_tf32() {
  _pretrain_echo 8192 6e-3 tf32 8 0.2843 7038 200 false true true 128 42 bert_lamb_pretraining true false \
                 4096 4e-3 0.128 1563 512
}

# ---- NVIDIA DGX A100 80 GB (8x A100): micro-batches 256 / 32 (fp16, bf16) and 128 / 16 (tf32) ---------------
dgxa100-80g_8gpu_fp16() {
  _pretrain_echo 8192 6e-3 fp16 8 0.2843 7038 200 false true true 32 42 bert_lamb_pretraining true true \
                 4096 4e-3 0.128 1563 128
}
dgxa100-80g_8gpu_tf32() {
  _pretrain_echo 8192 6e-3 tf32 8 0.2843 7038 200 false true true 64 42 bert_lamb_pretraining true false \
                 4096 4e-3 0.128 1563 256
}
# bf16 (ours): bf16 activations take the memory of fp16 ones, so the fp16 micro-batches; no loss scaling needed,
# and the all-reduce after accumulation runs in bf16 (run_pretraining.py uses the autocast dtype).
dgxa100-80g_8gpu_bf16() {
  _pretrain_echo 8192 6e-3 bf16 8 0.2843 7038 200 false true true 32 42 bert_lamb_pretraining true true \
                 4096 4e-3 0.128 1563 128
}

# ---- NVIDIA DGX H100 (8x H100 80 GB), bf16 (ours) ------------------------------------------------------------
# NVIDIA's global batches and learning rates; micro-batches by measurement (bench/RESULTS.md, BERT-large on one
# H200, compiled, the unpadded path of `unpad auto`): 256 at seq 128, where the GPU is the limit, and
# 64 at seq 512 (accumulation 64, not the A100's 32 x 128): at 32 a Hopper GPU waits for the host a third of each
# step (the compiled layers' launch overhead on a micro-batch that small), 338 sequences/s; at 64, 483 (+43%, peak
# memory 34 GiB, so it fits 80 GB); at 128, 497 (59 GiB).
dgxh100_8gpu_bf16() {
  _pretrain_echo 8192 6e-3 bf16 8 0.2843 7038 200 false true true 32 42 bert_lamb_pretraining true true \
                 4096 4e-3 0.128 1563 64
}

# ---- CPU demo (scripts/run_cpu_demo.sh): a small BERT on 4 M words of Wikipedia, a few minutes on 2 cores --------
# configs/bert-small-cpu.json (2 layers, hidden 128, no dropout) with the demo's own 8,000-piece vocabulary,
# 1 process, batch 32, no accumulation, 4,000 steps; AdamW 1e-3 with a 5% warm-up, then constant
# (run_cpu_demo.sh adds --lr_schedule constant; phase 1 at sequence 64, 30% masked). Measured on an AMD EPYC with
# AVX512-BF16, 2 cores, bf16 (bench/STUDIES.md, run H): the held-out context gain is +1.3 points at step
# 2,000, +5.9 at 3,000 and +9.9 at 4,000 (438 sequences/s, 5 min); the same run with the rate decayed linearly over
# 3,000 steps stayed at +1.7, and NVLAMB 1e-2 at sequence 128 never left the word-frequency
# plateau in the demo's minutes. Phase 2: 20 steps at sequence 512, batch 8, half the rate.
# Precision auto (run_pretraining.py --precision auto): bf16 where the CPU has it natively (AMX or AVX512-BF16 in
# its flags), fp32 otherwise. Measured with BERT-small-cpu and the 30 K vocabulary, batch 32 at sequence 128, one
# thread: on an AMD EPYC with AVX512-BF16, bf16 autocast 0.44-0.47 s a step against 0.60-0.61 s in fp32; on an AMD
# EPYC with AVX2 only, bf16 13 s against 0.64 s in fp32 (emulated bf16, 20x slower). So never bf16 by name on an
# unknown CPU.
# Data folders: $CPU_DEMO_DIR (default <repo>/results/cpu_demo), filled by scripts/run_cpu_demo.sh.
cpu() {
  local demo="${CPU_DEMO_DIR:-$_pretrain_repo/results/cpu_demo}"
  echo 32 1e-3 auto 1 0.05 4000 1000 false true false 1 42 bert_cpu_demo false false \
       8 5e-4 0.1 20 1 "$demo/hdf5_phase1/" "$demo/hdf5_seq512/" "$_pretrain_repo" None \
       "$_pretrain_repo/configs/bert-small-cpu.json" adamw
}

# ---- One GPU, a small BERT (ours): AdamW, measured on an H200 --------------------------------------------
# For a first real pre-training on one GPU: configs/bert-mini.json (4 layers, hidden 256), global batch 256 at
# sequence 128 for 30,000 steps (7.7 M sequences), then batch 64 at sequence 512 for 3,000 steps; AdamW, bf16.
# Phase 1's rate is measured (bench/STUDIES.md, "Pre-training on one GPU"; bench/gpu_study.py, H200): at
# batch 256, AdamW 1e-3 learned best of six runs; NVLAMB at the CPU rule's extrapolation (2.83e-2) diverged and at 1e-2
# fell back onto the unigram plateau after 5,000 steps; NVLAMB 4e-3 learned, behind AdamW. Phase 2 takes half of
# phase 1's rate, as the cpu preset does: not measured. Data: the phase-1 and phase-2 folders of
# data/create_datasets_from_start.sh, as for the DGX presets.
small_1gpu_bf16() {
  local p1="$_pretrain_prep_dir/hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training/"
  local p2="$_pretrain_prep_dir/hdf5_lower_case_1_seq_len_512_max_pred_80_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en/training/"
  echo 256 1e-3 bf16 1 0.1 30000 1000 false true false 1 42 bert_small_1gpu false false \
       64 5e-4 0.1 3000 1 "$p1" "$p2" /workspace/bert None /workspace/bert/configs/bert-mini.json adamw
}

# The names of scripts/run_pretraining.sh's positional arguments, in their order (its own variable names).
PRETRAIN_ARG_NAMES=(train_batch_size learning_rate precision num_gpus warmup_proportion train_steps
                    save_checkpoint_steps resume_training create_logfile accumulate_gradients
                    gradient_accumulation_steps seed job_name allreduce_post_accumulation
                    allreduce_post_accumulation_fp16 train_batch_size_phase2 learning_rate_phase2
                    warmup_proportion_phase2 train_steps_phase2 gradient_accumulation_steps_phase2 DATA_DIR_PHASE1
                    DATA_DIR_PHASE2 CODEDIR init_checkpoint BERT_CONFIG optimizer)
pretrain_slot() {  # NAME -> its index in a preset's argument list (0-based)
  local i
  for i in "${!PRETRAIN_ARG_NAMES[@]}"; do
    [[ "${PRETRAIN_ARG_NAMES[$i]}" == "$1" ]] && { echo "$i"; return 0; }
  done
  echo "pretrain_slot: scripts/run_pretraining.sh has no argument named '$1'" >&2
  return 1
}

# Every preset, for scripts and tests that iterate over them.
PRETRAIN_PRESETS=(dgx1_8gpu_fp16 dgx1_8gpu_fp32 dgx2_16gpu_fp16 dgx2_16gpu_fp32 dgxa100-40g_8gpu_fp16
                  dgxa100-40g_8gpu_tf32 dgxa100-80g_8gpu_fp16 dgxa100-80g_8gpu_tf32 dgxa100-80g_8gpu_bf16
                  dgxh100_8gpu_bf16 cpu small_1gpu_bf16)
