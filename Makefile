# lbc: two commands on a fresh machine: `make run` and `make test`.
PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PROTO_OUT   := lbcproto/lbc_pb2.py
GAME        ?= pong
PRESET      ?= cpu
ACTORS      ?= 1
NAME        ?= $(PRESET)-$(GAME)
ARGS        ?=

.PHONY: run test bench lint proto install clean

install: $(STAMP) $(PROTO_OUT)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

proto: $(PROTO_OUT)

$(PROTO_OUT): proto/lbcproto/lbc.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/lbcproto/lbc.proto
	touch lbcproto/__init__.py

run: install
	$(PY) -m lbc.launch --preset $(PRESET) --game $(GAME) --actors $(ACTORS) --name $(NAME) $(ARGS)

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m bench.throughput --preset $(PRESET) --game $(GAME) $(ARGS)

lint: install
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) lbcproto runs .pytest_cache
