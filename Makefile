# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each creates or reuses .venv and installs everything itself (pinned in requirements/).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.robot_latency-installed
REQS := requirements/base.txt requirements/ros.txt requirements/test.txt setup.py package.xml

# A sourced ROS 2 install (e.g. Humble from apt on a Jetson) already provides rclpy: then the
# venv sees the system packages and the ROS pip wheels (x86-64, CPython 3.11 only) are skipped.
SYSTEM_RCLPY := $(shell $(PYTHON) -c "import rclpy" >/dev/null 2>&1 && echo yes)
ifeq ($(SYSTEM_RCLPY),yes)
VENV_FLAGS := --system-site-packages
ROS_REQS :=
else
VENV_FLAGS :=
ROS_REQS := -r requirements/ros.txt
endif

.PHONY: help install demo test lint bench clean

help:
	@echo "make demo   run the main job on the bundled defaults (creates .venv on first use)"
	@echo "make test   run the test suite (creates .venv on first use)"
	@echo "make lint   ruff over the tree"
	@echo "make clean  remove .venv and build outputs"

$(STAMP): $(REQS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@echo "installing dependencies into $(VENV) (llama-cpp-python compiles on first install, ~5 min)"
	$(PIP) install --quiet -r requirements/base.txt -r requirements/test.txt $(ROS_REQS)
	$(PIP) install --quiet --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

# The main job: the inflated planner at three quant levels, replayed through the ROS 2 node.
demo: $(STAMP)
	rm -rf runs/demo
	$(VENV)/bin/robot-latency demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check robot_latency test bench setup.py launch

bench: $(STAMP)
	@echo "see docs/BENCHMARKS.md for each benchmark's command"

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
