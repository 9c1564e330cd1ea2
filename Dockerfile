# The image docker-compose.yml runs. CPU build of torch by default; on GPU machines build with
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
FROM python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX} torch
WORKDIR /opt/gpulayer
COPY pyproject.toml README.md ./
COPY gpulayer ./gpulayer
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT []
