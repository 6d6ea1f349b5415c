# BERT pre-training and fine-tuning on NVIDIA GPUs. The NGC PyTorch image brings CUDA, cuDNN, NCCL and its own
# PyTorch build (which requirements.txt deliberately leaves out); this adds the recipe's pure-Python dependencies
# and the code, at /workspace/bert as in NVIDIA's recipe (scripts/configs/pretrain_config.sh expects it there).
# 25.12 (PyTorch 2.10, CUDA 13.1) is the first NGC release whose PyTorch has every attention kernel the speed path
# picks by name (torch.nn.attention.varlen came in 2.10); the GPU rows of README.md ran on PyTorch 2.11 (the pip
# wheel, CUDA 13.0). An older image runs, with the slower kernels the speed path falls back to (README.md).
#
#   bash scripts/docker/build.sh                 # docker build -t bert:latest .
#   bash scripts/docker/launch.sh                # an interactive shell with data, checkpoints and results mounted
ARG FROM_IMAGE_NAME=nvcr.io/nvidia/pytorch:25.12-py3
FROM ${FROM_IMAGE_NAME}

ENV BERT_PREP_WORKING_DIR=/workspace/data \
    PYTHONUNBUFFERED=1
WORKDIR /workspace/bert

# Dependencies first: this layer is rebuilt only when requirements.txt changes.
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
# The project, editable (pyproject.toml): its modules import from anywhere, as with scripts/setup_cpu.sh.
RUN pip install --no-cache-dir --no-deps -e .
