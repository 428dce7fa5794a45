# The tfloop image, CPU: `docker build -t tfloop .` (GPU: Dockerfile.gpu).
# Runs bin/train as `tfloop-train`; the job specs under deploy/ pass its flags:
#   docker run --rm tfloop --model_dir=/tmp/run --train_steps=100
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# An init as PID 1: the kernel ignores every signal PID 1 has no handler for,
# so without one the start-up watchdog could not end a task whose cluster
# never formed (exit 138), and a signal's default action would do nothing.
RUN apt-get update && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# What `pip install .` needs: the project file, the README it names, every package folder.
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY collectives/ collectives/
COPY models/ models/
COPY inputs/ inputs/
COPY launch/ launch/
COPY bench/ bench/
COPY bin/ bin/
COPY tfloop/ tfloop/
# The README's install command (no extras: the CPU TensorFlow wheel).
RUN pip install --no-cache-dir . && rm -rf /src

# Not root; the run's files go where --model_dir says (gs:// or a mounted volume).
RUN useradd --create-home tfloop
USER tfloop
WORKDIR /home/tfloop
ENTRYPOINT ["tini", "--", "tfloop-train"]
