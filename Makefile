# lbc: two commands on a fresh machine: `make run` and `make test`.
PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PROTO_OUT   := lbcproto/lbc_pb2.py
NATIVE      := lbc/liblbc_native.so
PRESET      ?= cpu
GAME        ?= $(if $(filter catch,$(PRESET)),catch,pong)
ACTORS      ?= 1
NAME        ?= $(PRESET)-$(GAME)
ARGS        ?=
FRAMES      ?= 5000000
MINUTES     ?= 30
# Images: podman as it runs on this kind of machine (no daemon, vfs storage, cgroupfs).
PODMAN      ?= podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc
PODMAN_RUN  ?= --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
VARIANT     ?= cpu
IMAGE       ?= localhost/lbc:0.1.0$(if $(filter gpu,$(VARIANT)),-gpu,)
BASE        ?= localhost/debian-python:bookworm
IMAGE_DIR   := build/image

.PHONY: help run curve test test-extended test-fast bench soak lint proto install bytecode clean image image-smoke base-image wheelhouse test-tools

help:
	@echo "make run     train on this machine: PRESET=$(PRESET) GAME=$(GAME) ACTORS=$(ACTORS) NAME=$(NAME) ARGS='...'"
	@echo "             (ARGS: launcher flags, e.g. --resume, --overwrite, --port-base 41000, --duration 1800;"
	@echo "              all of them: .venv/bin/python -m lbc.launch --help)"
	@echo "make curve   a learning run for FRAMES=$(FRAMES) emulator frames, then its plot and table (lbc report)"
	@echo "make test    lint and the test suite CI runs (about 16 minutes on two cores)"
	@echo "make test-fast  lint and the unit tests not marked slow (about a minute): the inner loop"
	@echo "make test-extended  the preset learning runs that make test leaves out (decision 47; about eight minutes)"
	@echo "make bench   throughput of the whole system and of each stage"
	@echo "make soak    MINUTES=$(MINUTES) of Catch, each service's memory growth in MB/min"
	@echo "make image   the container image (VARIANT=cpu|gpu); kubectl apply -k k8s/ deploys it"
	@echo "make install the virtual environment (.venv) alone"

install: $(STAMP) $(PROTO_OUT) $(NATIVE)

# uv installs in about half pip's time (71-86 s against 149 s on two cores, bytecode compiled as pip compiles
# it; CI installs on every run). uv does not read pip's configuration: it is given pip's local wheel folder
# (PIP_FIND_LINKS, else pip's find-links setting; this machine kind keeps its CPU torch there, and without it
# torch==2.13.0 would come as the CUDA build). pip installs where uv fails. Evaluated only when installing.
FIND_LINKS   = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON_BOOT) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL   = $(VENV)/bin/uv pip install -q --python $(PY) $(addprefix --find-links ,$(FIND_LINKS))

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'uv==0.13.9'
	$(UV_INSTALL) --compile-bytecode -c constraints.txt -e '.[dev]' || $(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The project's own modules compiled once: where PYTHONDONTWRITEBYTECODE is set (this machine kind sets it) every
# process would compile them again on starting, and a test run starts hundreds (each service of each system run).
# Incremental: only sources changed since the last compile are compiled again.
bytecode: install
	$(PY) -m compileall -q lbc actor_svc learner_svc replay_svc bandit_svc bench lbcproto >/dev/null

proto: $(PROTO_OUT)

$(PROTO_OUT): proto/lbcproto/lbc.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/lbcproto/lbc.proto
	touch lbcproto/__init__.py
	# the editable install maps only packages that existed when it ran: map the generated one too
	$(UV_INSTALL) --no-deps -e . || $(PY) -m pip install -q --no-deps -e .

# lbc.native's C++ (the CPU learner's LayerNorm-LSTM unroll and frame stacks, the actors' frame ring, the Atari screens'
# resize; decisions 90, 94, 96, 97): about 20 s of g++ on two cores, its three sources at once. Where it cannot be built
# torch's passes do that work and ALE resizes the screens (the same values), each log saying so.
$(NATIVE): lbc/csrc/ln_lstm.cpp lbc/csrc/area_resize.cpp lbc/csrc/frame_stacks.cpp lbc/native.py $(STAMP)
	$(PY) -m lbc.native || echo "lbc/liblbc_native.so not built: the CPU learner unrolls its LSTM by TorchScript" >&2

run: bytecode
	$(PY) -m lbc.launch --preset $(PRESET) --game $(GAME) --actors $(ACTORS) --name $(NAME) $(ARGS)

# A learning curve: the whole system (with its evaluator) for FRAMES emulator frames, the final checkpoint
# evaluated as the evaluator does (the score at the budget), then the report (runs/curve-PRESET-GAME.png
# and .md beside the run folder).
curve: bytecode
	$(PY) -m lbc.launch --preset $(PRESET) --game $(GAME) --actors $(ACTORS) --name curve-$(NAME) \
	  --until-frames $(FRAMES) $(ARGS)
	$(VENV)/bin/lbc evaluate runs/curve-$(NAME)
	$(VENV)/bin/lbc report runs/curve-$(NAME) --name curve-$(NAME)

# Tools the deployment tests run for real: Prometheus/promtool (Debian) and kubectl with kustomize.
test-tools:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)
	@command -v kubectl >/dev/null || (echo "kubectl (with kustomize) is needed by tests/deploy" >&2; exit 1)

test: bytecode test-tools
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not extended" --durations=15 tests

# Preset learning runs whose code the runs in make test already cover (docs/decisions.md 47): about eight minutes.
test-extended: bytecode
	$(PY) -m pytest -q -m extended tests

# The inner loop: lint and the unit tests not marked slow (about a minute); make test is what CI runs.
test-fast: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not slow" tests/unit

bench: bytecode
	$(PY) -m bench.throughput $(if $(filter file,$(origin PRESET)),,--preset $(PRESET)) --game $(GAME) --levers --profile \
		--out runs/bench/$$(date +%Y%m%d-%H%M%S) $(ARGS)

# Memory over time: Catch for MINUTES minutes, each service's RSS slope in MB/min (not part of make test).
soak: bytecode
	$(PY) -m bench.soak --minutes $(MINUTES) $(ARGS)

# A Debian bookworm base with Python 3.11, made locally (no registry needed): debootstrap + podman import.
base-image:
	@$(PODMAN) image exists $(BASE) || { \
	  command -v debootstrap >/dev/null || (apt-get update -qq && apt-get install -y -qq debootstrap); \
	  rm -rf build/rootfs && mkdir -p build && \
	  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm build/rootfs \
	    http://deb.debian.org/debian && \
	  tar -C build/rootfs -c . | $(PODMAN) import - $(BASE) && rm -rf build/rootfs; }

# The exact pinned wheels: lbc itself (with its generated gRPC stubs) and every dependency.
wheelhouse: install
	rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)/wheelhouse
	$(PY) -m pip wheel -q --no-deps -w $(IMAGE_DIR)/wheelhouse . && rm -rf build/lib build/bdist.*
	$(if $(filter gpu,$(VARIANT)),PIP_FIND_LINKS= ,)$(PY) -m pip download -q -c constraints.txt --only-binary=:all: \
	  -d $(IMAGE_DIR)/wheelhouse $(IMAGE_DIR)/wheelhouse/lbc-*.whl

image: base-image wheelhouse
	$(PODMAN) build $(PODMAN_RUN) --build-arg BASE=$(BASE) -f Dockerfile -t $(IMAGE) $(IMAGE_DIR)
	@echo "built $(IMAGE)"

# One container per service from the image, locked down as in the pods (non-root, read-only root,
# no capabilities); each must answer its gRPC health check.
image-smoke: image
	$(PY) -m tests.image_smoke --image $(IMAGE) --podman "$(PODMAN)" --run-flags "$(PODMAN_RUN)"

lint: install
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) lbcproto runs .pytest_cache build $(NATIVE)
