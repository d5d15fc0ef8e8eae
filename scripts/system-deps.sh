#!/usr/bin/env bash
# Install the Debian packages the optional tests and benchmarks use (`make system-deps`):
# Debian's real Fashion-MNIST (real-data accuracy tests, `make bench`), a local Slurm cluster
# (scripts/slurm/local_cluster.sh): controller, node daemon, client tools, munge for authentication,
# iproute2 for the nodes' network namespaces; and Chromium with its chromedriver, which the browser
# test drives headless (tests/test_tensorboard_browser.py). Must run as root (CI runs it as root).
set -euo pipefail

PACKAGES=(dataset-fashion-mnist slurmctld slurmd slurm-client munge iproute2 chromium chromium-driver)

if [[ $(id -u) -ne 0 ]]; then
    echo "make system-deps installs Debian packages: run it as root (sudo make system-deps)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y --no-install-recommends "${PACKAGES[@]}"; }

# Try without refreshing the package lists first (fast when they are fresh);
# refresh and retry only if that fails.
if ! install; then
    echo "system-deps.sh: install failed, running apt-get update and retrying" >&2
    apt-get update
    install
fi
