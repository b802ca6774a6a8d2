# isrlab: the two commands are `make demo` and `make test`. Both set up what they need.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
# Debian packages the project needs: command to probe -> package that provides it.
SYSDEPS := /usr/sbin/sshd:openssh-server /usr/sbin/iptables:iptables /usr/sbin/route:net-tools \
           /usr/sbin/ip:iproute2 /usr/bin/faketime:faketime /usr/share/zookeeper/bin/zkServer.sh:zookeeper \
           /usr/bin/java:default-jre-headless /usr/sbin/tc:iproute2 /usr/bin/g++:g++ \
           /usr/bin/kcat:kcat

.PHONY: all setup sysdeps venv build test lint typecheck unit demo soak bench sim-seeds clean

all: test

setup: sysdeps venv build

sysdeps:
	@missing=""; for pair in $(SYSDEPS); do f=$${pair%%:*}; p=$${pair##*:}; \
	  [ -e "$$f" ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null \
	  || { echo "could not install$$missing: run as root or install them by hand"; exit 1; }; \
	fi

$(VENV)/.installed: pyproject.toml setup.py
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP) install -q -U pip "setuptools>=77" > $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@$(PIP) install -q -e '.[dev]' >> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@touch $@

venv: $(VENV)/.installed

# The compiled parts (Cython: the queue checker's native screen, the linearizability search's
# loop, the log cleaner's scan): recompiled only when a .pyx changed.
build: venv
	@$(PY) -W ignore setup.py -q build_ext --inplace 2>&1 | grep -v '^Compiling\|^\[1/1\]\|^$$' || true

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy cannot follow setuptools' editable finder (isrlab.broker -> broker/): it checks the five
# folders through links that give them their installed names.
typecheck: venv
	@mkdir -p build/typecheck/isrlab && for f in broker checkers harness nemeses pipeline; do \
	  ln -sfn ../../../$$f build/typecheck/isrlab/$$f; done
	$(VENV)/bin/mypy

# Two pytest processes side by side (tests/conftest.py): the tests that start processes (they
# mostly wait on cluster timers), shown as they run, and the in-process ones, whose log is
# printed when both are done (all of it if a test failed). The in-process tests run at a lower
# priority: they take the CPU the cluster tests leave, and never slow a cluster's timers down.
unit: setup
	@mkdir -p build; log=build/unit-in-process.log; \
	nice -n 15 $(VENV)/bin/pytest -q -m 'not slow and not processes' > $$log 2>&1 & inproc=$$!; \
	echo "== tests that start processes (the in-process tests run beside them, log: $$log)"; \
	$(VENV)/bin/pytest -q -m 'not slow and processes'; procs=$$?; \
	wait $$inproc; inrc=$$?; \
	echo "== in-process tests ($$log)"; \
	if [ $$inrc -eq 0 ]; then tail -n 45 $$log; else cat $$log; fi; \
	[ $$procs -eq 0 ] && [ $$inrc -eq 0 ]

test: setup lint typecheck unit

demo: setup
	$(VENV)/bin/isrlab demo

soak: setup
	$(VENV)/bin/pytest -q -m slow

# 200 seeds of the default (safe) configuration on the simulator: exit 1 if one is invalid
sim-seeds: setup
	$(VENV)/bin/isrlab sim --seeds 1-200 --workers 2 --store build/sim-seeds

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) *.egg-info .mypy_cache .ruff_cache build checkers/queue/_screen.cpp checkers/queue/_screen.*.so checkers/linear/_search.cpp checkers/linear/_search.*.so
