# The llm-vitals image: exporter, remediator and simulator (the same package, three commands).
#   docker build -t llm-vitals .
#   docker run --rm llm-vitals llm-vitals-exporter --check-config --config /etc/llm-vitals/exporter.yaml
# Pure Python with wheels for every dependency: no compiler, so the build stage only keeps pip
# and its caches out of the final image.
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/llm-vitals
COPY . /src
RUN /opt/llm-vitals/bin/pip install /src

FROM python:3.11-slim
ENV PATH=/opt/llm-vitals/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/llm-vitals /opt/llm-vitals
# A fixed non-root uid, so volume ownership and Kubernetes runAsUser/fsGroup can name it.
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /var/lib/llm-vitals llm-vitals \
    && mkdir -p /var/lib/llm-vitals /etc/llm-vitals \
    && chown llm-vitals:llm-vitals /var/lib/llm-vitals
USER 10001:10001
WORKDIR /var/lib/llm-vitals
# exporter, remediator, simulated vLLM
EXPOSE 9471 9472 8000
CMD ["llm-vitals-exporter", "--help"]
