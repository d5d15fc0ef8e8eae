"""Several machines' torchrun agents on this one, for the tests of multi-node launches."""

import subprocess
from pathlib import Path

from tests.helpers import environment, free_port, python


def torchrun_nodes(
    module: str,
    args: list[str],
    cwd: Path,
    run_id: str,
    nodes: int = 2,
    per_node: int = 1,
    options: tuple[str, ...] = (),
    env: dict | None = None,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess]:
    """Run `module` as a torchrun launch of `nodes` machines on this one: one agent per machine (`python -m
    project.optional.torchrun.launcher`, as on every machine), meeting at a c10d rendezvous on 127.0.0.1, each starting
    `per_node`
    processes. The agents all try to serve the rendezvous; the first to bind its port does, as on one host.
    """
    command = [
        python(),
        "-m",
        "project.optional.torchrun.launcher",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id={run_id}",
        *options,
        "-m",
        module,
        *args,
    ]
    full_env = environment(env)
    agents = [
        subprocess.Popen(command, cwd=cwd, env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(nodes)
    ]
    results = []
    for agent in agents:
        stdout, stderr = agent.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(agent.args, agent.returncode, stdout, stderr))
    return results
