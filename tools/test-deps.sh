#!/usr/bin/env bash
# The real parts the tests use, installed (the one list: `.ci/run` and `make test-deps` both
# run this). Without them, their tests skip locally (and fail under CI=true); the run's
# last line names what was skipped for a missing part.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# Under CI a missing real part fails its tests instead of skipping them, so install them:
# OpenSSH servers on loopback stand in for SSH hosts (tests/sshd.py); podman (with runc),
# a registry and busybox build, push and run the job's images (tests/registry.py); docker.io
# gives the tests a private dockerd of their own (tests/dockerd.py), for the docker path;
# openmpi-bin runs the mpi launcher for real; chromium is the headless browser the
# dashboard's tests drive (through Playwright, which the dev extra installs); slurm-wlm and
# munge run a real Slurm cluster on this machine (tests/rigs/slurm.py).
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
[ -x /bin/busybox ] || missing+=(busybox-static)
[ -x /usr/bin/chromium ] || missing+=(chromium)
lean=()  # installed without their recommends (git, apparmor, compilers...): unused here
{ [ -x /usr/sbin/dockerd ] && [ -x /usr/bin/docker-init ]; } || lean+=(docker.io)
command -v mpirun >/dev/null || lean+=(openmpi-bin)
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null; } \
  || lean+=(slurm-wlm)
[ -x /usr/sbin/munged ] || lean+=(munge)
if [ "${#missing[@]}" -gt 0 ] || [ "${#lean[@]}" -gt 0 ]; then
  $SUDO apt-get update -qq
fi
if [ "${#missing[@]}" -gt 0 ]; then
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if [ "${#lean[@]}" -gt 0 ]; then
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${lean[@]}"
fi
# podman in a container: no ulimits it may not raise, and runc as the runtime.
CONF=/etc/containers/containers.conf
if ! grep -qs '^default_ulimits = \[\]' "$CONF" || ! grep -qs '^runtime = "runc"' "$CONF"; then
  if [ -s "$CONF" ]; then
    echo "warning: replacing $CONF (kept as $CONF.orig) for podman in CI" >&2
    $SUDO cp "$CONF" "$CONF.orig"
  fi
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' | $SUDO tee "$CONF" >/dev/null
fi
