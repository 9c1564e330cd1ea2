# The image docker-compose.yml runs. The CPU build of torch by default; docker-compose.yml builds the GPU
# worker's image from a CUDA index instead, as you can by hand:
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 -t gpulayer:cuda .
FROM python:3.11-slim
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=torch==2.13.0
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX_URL} "${TORCH_SPEC}"
WORKDIR /opt/gpulayer
COPY pyproject.toml README.md ./
COPY gpulayer ./gpulayer
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT []
