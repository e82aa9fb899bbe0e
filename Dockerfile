# The llm-vitals image: exporter, remediator and simulator (the same package, three commands).
#   docker build -t llm-vitals .
#   docker run --rm llm-vitals llm-vitals-exporter --check-config --config /etc/llm-vitals/exporter.yaml
#
# BASE_IMAGE: any Debian-like image with python3 (>= 3.11) and its venv module. Users get the
# official python image; the real-Docker tier (tools/real-docker-test.sh) passes a Debian bookworm
# image it made locally with debootstrap, since nothing can be pulled there.
# WHEELHOUSE: a directory of wheels inside the build context (`pip wheel -w DIR .` on the host,
# which builds the project's own wheel too). When set, the image installs from it alone
# (--no-index): the build fetches nothing, and runs with `docker build --network none`.
# Pure Python plus manylinux wheels for every dependency: no compiler, so the build stage only
# keeps pip and its caches out of the final image.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG WHEELHOUSE=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/llm-vitals
COPY . /src
RUN if [ -n "$WHEELHOUSE" ]; then \
      /opt/llm-vitals/bin/pip install --no-index --find-links "/src/$WHEELHOUSE" llm-vitals; \
    else \
      /opt/llm-vitals/bin/pip install /src; \
    fi

FROM ${BASE_IMAGE}
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
