# Two commands do all set-up: `make train` and `make test` each create .venv and install into it when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FASHION_MNIST_DEBIAN := /usr/share/datasets/fashion-mnist

.PHONY: train test test-fast test-hydra1.4 coverage mutants golden bench lint lock tensorboard remove-part system-deps data-fashion-mnist clean

# The versions a green CI run installed, for this Python (`make lock` writes them): installed where they exist, so a
# fresh machine gets what CI tested; another Python resolves pyproject.toml's ranges afresh.
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CONSTRAINTS := $(wildcard constraints-py$(PYTHON_VERSION).txt)

# The venv is rebuilt when pyproject.toml or the constraints change. torch/torchvision are pinned to a pair known to
# import together.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/python -m pip install --quiet -e ".[dev]" $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))
	touch $(STAMP)

train: $(STAMP)  ## the main job: the toy experiment on the embedded data, on one device
	$(BIN)/python -m project.train $(ARGS)

test: $(STAMP)  ## the whole test suite (skips, with the reason, what this machine cannot run)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)  ## the inner loop: in-process tests only (a test that would start a process skips there)
	PROJECT_TESTS_IN_PROCESS=1 $(BIN)/python -m pytest -m "not slow and not slurm and not gpu and not realdata" $(ARGS)

# The next Hydra (a release candidate today) and the OmegaConf it requires, over the venv's own packages: a venv whose
# own site-packages hold those two, with the main venv's site-packages (and so its editable install) below them.
HYDRA_NEXT := hydra-core==1.4.0rc3 omegaconf==2.4.1rc1
NEXT_VENV := .venv-hydra1.4
NEXT_STAMP := $(NEXT_VENV)/.installed

$(NEXT_STAMP): $(STAMP)
	rm -rf $(NEXT_VENV) && $(PYTHON) -m venv --without-pip $(NEXT_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(NEXT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/main_venv.pth"
	$(BIN)/python -m pip --python $(NEXT_VENV)/bin/python install --quiet --no-deps $(HYDRA_NEXT)
	# The commands the tests run beside python (tensorboard, wandb, torchrun), .venv's (not its pip: no install lands there).
	for command in $(BIN)/*; do name=$$(basename $$command); case $$name in pip*) continue;; esac; \
	  test -e $(NEXT_VENV)/bin/$$name || ln -s $(abspath $(BIN))/$$name $(NEXT_VENV)/bin/; done
	touch $(NEXT_STAMP)

test-hydra1.4: $(NEXT_STAMP)  ## the in-process tests again on Hydra 1.4 (its release candidate), in .venv-hydra1.4
	PROJECT_TESTS_IN_PROCESS=1 $(NEXT_VENV)/bin/python -m pytest -m "not slow and not slurm and not gpu and not realdata" $(ARGS)

coverage: $(STAMP)  ## the whole suite and its Hydra 1.4 pass, as .ci/run runs them, measuring what they run of project/ (their processes too): outputs/coverage/index.html
	$(BIN)/python -m pytest --cov --cov-report= $(ARGS)
	$(MAKE) test-hydra1.4 ARGS="--cov --cov-append --cov-report=term --cov-report=html $(ARGS)"

# Not part of `make test`: the mutation tool is installed here, when asked, and a whole run takes hours.
mutants: $(STAMP)  ## the engine's mutation score: each module's mutants against its guard tests (SAMPLE=N per module, SEED=S)
	$(BIN)/python -m pip install --quiet "cosmic-ray==8.7.0" $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))
	$(BIN)/python scripts/mutants.py $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(SEED),--seed $(SEED)) $(ARGS)

golden: $(STAMP)  ## train the shipped recipes, record their per-step losses in tests/golden/, report what moved (docs/testing.md)
	$(BIN)/python -m scripts.golden

bench: $(STAMP)  ## the benchmark suite: one table, bench/results/<date>.json and PNGs (ARGS=--quick: a smoke run)
	$(BIN)/python -m bench $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lock: $(STAMP)  ## after a green `make test`: write the venv's versions to constraints-py<version>.txt, which `make` installs, and report what moved (make golden)
	{ echo "# pip freeze of a venv whose make test passed ($$(date -u +%Y-%m-%d)); make lock writes it"; \
	  $(BIN)/python -m pip freeze --exclude-editable --exclude cosmic-ray; } > constraints-py$(PYTHON_VERSION).txt
	$(MAKE) golden

tensorboard: $(STAMP)  ## serve every run under outputs/ on http://127.0.0.1:6006
	$(BIN)/tensorboard --logdir outputs --host 127.0.0.1 --port 6006

remove-part: $(STAMP)  ## delete an optional part and all its files: PART=<name> (project/optional/parts.yaml lists them)
	$(BIN)/python scripts/remove_part.py $(PART)

system-deps:  ## root only: Debian's Fashion-MNIST, Slurm and Chromium packages (real-data, Slurm and browser tests)
	bash scripts/system-deps.sh

data-fashion-mnist:  ## link Debian's Fashion-MNIST into data/ so `data=fashion_mnist` finds it offline
	@test -d $(FASHION_MNIST_DEBIAN) || { echo "$(FASHION_MNIST_DEBIAN) is missing: run 'make system-deps' as root"; exit 1; }
	mkdir -p data/FashionMNIST/raw
	ln -sf $(FASHION_MNIST_DEBIAN)/*.gz data/FashionMNIST/raw/

clean:  ## remove the venv (runs under outputs/ are kept)
	rm -rf $(VENV)

# The optional Slurm part's targets (slurm-up, slurm-down), gone with it.
-include scripts/slurm/slurm.mk
