#!/usr/bin/env bash
# The GPU checks in one call, on a machine with a CUDA GPU, from the repository root:
#     OUT=/some/dir bash bench/gpu.sh
# (a) the tests marked gpu anywhere under tests/ (tests/test_gpu.py and the optional parts' own, trainer=fsdp on one
# GPU among them), (b) `python3 -m bench --gpu`: GPU-resident data, epoch times, Lightning/reference on the GPU,
# bf16-mixed against fp32, trainer=gpu and trainer=dp (devices=[0]), 8 one-GPU jobs of a sweep one at a time and
# side by side (hydra/launcher=parallel, a GPU each), and the accuracy of experiment=mnist on Fashion-MNIST (the
# suites of optional parts deleted from this tree are left out), (c) the bench's fsdp_memory suite
# with --device cpu, where the fsdp part is here: FSDP against DDP takes 2 ranks, which one GPU cannot give, so they
# are 2 gloo processes on this machine's CPU. Everything lands in $OUT (at most 8 files): the bench's JSONs and PNGs,
# pytest-gpu.log, bench-gpu.log, fsdp-memory.log, nvidia-smi.txt. Fails soft: every part runs whatever happened
# before it; the last line lists what failed, and the exit status is the number of failed parts.
# Expects: Fashion-MNIST's four .gz files in .gpudata/FashionMNIST/raw/; Hydra (hydra-core, omegaconf, antlr4)
# installed, or as wheels in .whl/ (installed into /tmp/site, no network needed).
# BENCH_ARGS is added to the bench's command line: BENCH_ARGS="--device cpu --quick" rehearses the script on a CPU.
set -u
OUT=${OUT:-outputs/gpu}
mkdir -p "$OUT"
failed=()
started=$SECONDS

if ! python3 -c "import hydra" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl || failed+=("pip install .whl/")
    else
        failed+=("hydra-core missing and no .whl/")
    fi
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.txt" 2>&1 || failed+=("nvidia-smi")
python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())"

echo "== (a) pytest -m gpu"
if grep -rqs "pytest.mark.gpu" tests; then
    if python3 -c "import pytest" 2>/dev/null; then
        timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests \
            >"$OUT/pytest-gpu.log" 2>&1 || failed+=("pytest -m gpu (see pytest-gpu.log)")
        tail -n 15 "$OUT/pytest-gpu.log"
    else
        failed+=("pytest is not installed")
    fi
else
    echo "no gpu tests"
fi

echo "== (b) python3 -m bench --gpu"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
timeout 330 python3 -m bench --gpu --data-root .gpudata --out "$OUT" ${BENCH_ARGS:-} >"$OUT/bench-gpu.log" 2>&1 \
    || failed+=("bench --gpu (see bench-gpu.log)")
sed -n '/^---/,$p' "$OUT/bench-gpu.log"  # the table
grep -E "^bench: |Error" "$OUT/bench-gpu.log" | tail -n 20

echo "== (c) python3 -m bench --only fsdp_memory --device cpu"
if [ -f bench/fsdp_memory.py ]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
    timeout 150 python3 -m bench --only fsdp_memory --device cpu --data-root .gpudata --out "$OUT" ${BENCH_ARGS:-} \
        >"$OUT/fsdp-memory.log" 2>&1 || failed+=("bench --only fsdp_memory (see fsdp-memory.log)")
    grep "^fsdp / ddp" "$OUT/fsdp-memory.log"
else
    echo "fsdp_memory left out: bench/fsdp_memory.py is not here (its optional part was removed)"
fi

echo "== done in $((SECONDS - started)) s; files: $(find "$OUT" -maxdepth 1 -type f -printf '%f ' | sort)"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
else
    echo "all parts passed"
fi
exit ${#failed[@]}
