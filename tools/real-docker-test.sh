#!/usr/bin/env bash
# `make test-docker`: the image, the compose stack and the docker executor on a real Docker Engine.
# usage: tools/real-docker-test.sh [extra pytest args]
#
# Starts a dockerd of its own (fixtures/docker RECIPE): its own socket, data root, exec root and pid
# file under one short /tmp directory, no bridge and no iptables (containers use host networking,
# all traffic on loopback), and stops it by its PID on the way out, whatever happened; then removes
# that directory, so no container, image or volume outlives the run. The base image's rootfs is
# cached outside the clone (tools/real-docker-setup.sh); everything else is rebuilt every run.
# A machine that cannot run it is one SKIPPED line and status 0, or a failure under
# LLM_VITALS_REQUIRE_REAL_DOCKER=1 (CI).
set -uo pipefail
cd "$(dirname "$0")/.."
# Debian's CLI, the daemon's own version (another docker on PATH may be newer than the daemon).
DOCKER=/usr/bin/docker

source tools/real-tier-lib.sh
tier_setup docker
BASE_TAR=$(tail -1 <<<"$SETUP_OUT")

CACHE=${LLM_VITALS_CACHE:-.cache}
LOGS=$CACHE/real-docker-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
RUN=$(mktemp -d /tmp/lvd.XXXXXX)
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
DOCKERD_PID=

stop_daemon() {
  # By PID only: other engineers may run daemons of their own on this machine.
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    kill -TERM "$DOCKERD_PID"
    # dockerd stops its containers (10 s each at most) and its containerd before it exits.
    for _ in $(seq 1 600); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
      echo "real-Docker tier: dockerd $DOCKERD_PID still running after 60 s; SIGKILL" >&2
      kill -KILL "$DOCKERD_PID" 2>/dev/null
      cpid=$(cat "$RUN/exec/containerd/containerd.pid" 2>/dev/null || true)
      [ -n "$cpid" ] && kill -TERM "$cpid" 2>/dev/null
    fi
  fi
  cp "$RUN/dockerd.log" "$LOGS/dockerd.log" 2>/dev/null
  # Never delete through a mount the daemon left behind (overlay, shm, netns): unmount first.
  findmnt -rn -o TARGET | grep "^$RUN/" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf "$RUN"
}
trap stop_daemon EXIT
trap 'exit 130' INT TERM

# Lower priority than what judges it (the tests and the exporter they read): nice is inherited by
# containerd, its shims and every container; setsid gives it an autogroup of its own, niced too.
setsid nice -n 10 dockerd --host "unix://$SOCK" --data-root "$RUN/data" --exec-root "$RUN/exec" \
  --pidfile "$PIDFILE" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
  >"$RUN/dockerd.log" 2>&1 </dev/null &
DOCKERD_PID=$!
echo 10 >"/proc/$DOCKERD_PID/autogroup" 2>/dev/null
for _ in $(seq 1 300); do
  [ -S "$SOCK" ] && $DOCKER -H "unix://$SOCK" version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || break
  sleep 0.1
done
if ! $DOCKER -H "unix://$SOCK" version >/dev/null 2>&1; then
  echo "real-Docker tier: dockerd did not come up; last lines of its log:" >&2
  tail -20 "$RUN/dockerd.log" >&2
  exit 1
fi
# The daemon's own word on its PID (setsid and nice exec in place, so it is $! anyway).
[ -s "$PIDFILE" ] && DOCKERD_PID=$(cat "$PIDFILE")
echo "real-Docker tier: dockerd $DOCKERD_PID on $SOCK ($(( $(date +%s) - TIER_STARTED )) s since start)"

# Serial on purpose: one daemon, fixed container names in the compose stack, a 2-core machine.
LLM_VITALS_REAL_DOCKER=1 LLM_VITALS_DOCKER_SOCK=$SOCK LLM_VITALS_DOCKER_RUN=$RUN \
LLM_VITALS_DOCKER_BASE_TAR=$BASE_TAR \
  timeout -k 60 1500 "$PYTHON" -m pytest tests/real_docker -p no:randomly -p no:cacheprovider -s "$@" \
  2>&1 | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
[ $rc = 124 ] && echo "real-Docker tier: pytest timed out after 1500 s" >&2
left=$($DOCKER -H "unix://$SOCK" ps -aq | wc -l)
echo "real-Docker tier: $left container(s) left on the tier's daemon before it stops (all go with its data root)"
echo "real-Docker tier: $(( $(date +%s) - TIER_STARTED )) s in all (pytest status $rc)"
exit $rc
