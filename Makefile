# isrlab: the two commands are `make demo` and `make test`. Both set up what they need.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
# Debian packages the project needs: command to probe -> package that provides it.
SYSDEPS := /usr/sbin/sshd:openssh-server /usr/sbin/iptables:iptables /usr/sbin/route:net-tools \
           /usr/sbin/ip:iproute2 /usr/bin/faketime:faketime /usr/share/zookeeper/bin/zkServer.sh:zookeeper \
           /usr/bin/java:default-jre-headless /usr/sbin/tc:iproute2

.PHONY: all setup sysdeps venv test lint typecheck unit demo soak bench clean

all: test

setup: sysdeps venv

sysdeps:
	@missing=""; for pair in $(SYSDEPS); do f=$${pair%%:*}; p=$${pair##*:}; \
	  [ -e "$$f" ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null \
	  || { echo "could not install$$missing: run as root or install them by hand"; exit 1; }; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP) install -q -U pip >/dev/null
	@$(PIP) install -q -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

unit: setup
	$(VENV)/bin/pytest -q

test: setup lint typecheck unit

demo: setup
	$(VENV)/bin/isrlab demo

soak: setup
	$(VENV)/bin/pytest -q -m slow

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) *.egg-info .mypy_cache .ruff_cache
