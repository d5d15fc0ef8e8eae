"""Every test of logger=wandb runs with wandb's files in its own temporary directory, logged in nowhere, offline.

The runs these tests start inherit this environment: nothing lands in $HOME (wandb's cache, settings and staging
dirs), a developer's own `wandb login` (its netrc entry, WANDB_API_KEY) cannot send a test run online, and
WANDB_MODE=offline keeps wandb off the network; the tests of the online decision lift it themselves.

The runs share one wandb-core service, started detached (`wandb beta core start`) and named in WANDB_SERVICE, where
each would start its own. A run the tests' preloaded Python forks for a shell's `python` (tests/preloaded_python.py,
the docs pages' commands) answers `os.getpid()` with its client's pid, which wandb hands its own service as the
parent to watch: that service, whose real parent is another process, takes the parent for gone and quits at once,
and the run waits for it forever.
"""

import subprocess
import sys
from collections.abc import Iterator

import pytest

CREDENTIALS = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY")


@pytest.fixture(scope="module", autouse=True)
def wandb_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in CREDENTIALS:
            patch.delenv(name, raising=False)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("NETRC", str(home / "netrc"))  # no such file: no login
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
            (home / name).mkdir()
            patch.setenv(name, str(home / name))
        core = [sys.executable, "-m", "wandb", "beta", "core"]
        started = subprocess.run([*core, "start"], capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        patch.setenv("WANDB_SERVICE", started.stdout.strip())
        yield
        subprocess.run([*core, "stop"], capture_output=True, timeout=120)
