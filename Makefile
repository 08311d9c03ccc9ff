# placer: `make demo` runs the main job end to end on a tiny model; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

# The llama.cpp side environment (docs/ecosystem.md, "Running llama.cpp itself"): Python 3.12
# with the cyllama-vulkan wheel (llama.cpp b11669 with its expert cache), Vulkan's loader and
# Mesa's software device, and llama.cpp's convert_hf_to_gguf.py (from llama-cpp-python's
# sdist, which vendors llama.cpp) for the tests' tiny GGUFs.
LLAMA_VENV := .venv-llama
LLAMA_STAMP := $(LLAMA_VENV)/.installed
LLAMA_WHEEL := cyllama-vulkan==0.7.0
LLAMA_SDIST := llama-cpp-python==0.3.36
LLAMA_SRC := llama_cpp_python-0.3.36/vendor/llama.cpp
VULKAN_DEBS := libvulkan1 mesa-vulkan-drivers

# llama-server for `placer bench --engine llamacpp --server` (tests/test_llamacpp_server.py):
# built once per machine (under ~/.cache/placer), CPU backend, from the llama.cpp that
# llama-cpp-python 0.3.36 vendors (a build without the expert cache: the driver's test runs
# the options without one).
LLAMA_SERVER := $(LLAMA_VENV)/bin/llama-server
LLAMA_SERVER_HOME := $(HOME)/.cache/placer/llama-server-0.3.36
LLAMA_SERVER_BUILT := $(LLAMA_SERVER_HOME)/llama-server
LLAMA_SERVER_FLAGS := -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF

.PHONY: install llama-env llama-server test demo bench bench-gpu train-moe lint clean

install: $(STAMP)

# torch first, pinned: 2.13.0 is the CPU build on disk here; any other spec pulls a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

llama-env: $(LLAMA_STAMP)

$(LLAMA_STAMP): Makefile
	dpkg -s $(VULKAN_DEBS) >/dev/null 2>&1 || \
	  { apt-get update -q && apt-get install -y -q --no-install-recommends $(VULKAN_DEBS); }
	py=$$(for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 \
	        /usr/bin/python3.12 /usr/local/bin/python3.12; do \
	        $$p -c '' 2>/dev/null && echo $$p && break; done); \
	  [ -n "$$py" ] || { echo "make llama-env: no python3.12 found"; exit 1; }; \
	  $$py -m venv --clear $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install -q $(LLAMA_WHEEL)
	$(LLAMA_VENV)/bin/pip download -q --no-deps --no-binary :all: $(LLAMA_SDIST) \
	  -d $(LLAMA_VENV)/sdist
	mkdir -p $(LLAMA_VENV)/llama.cpp
	tar xzf $(LLAMA_VENV)/sdist/*.tar.gz -C $(LLAMA_VENV)/llama.cpp --strip-components=3 \
	  $(LLAMA_SRC)/convert_hf_to_gguf.py $(LLAMA_SRC)/conversion $(LLAMA_SRC)/gguf-py
	rm -rf $(LLAMA_VENV)/sdist
	touch $(LLAMA_STAMP)

llama-server: $(LLAMA_SERVER)

# Built once per machine (a fresh clone, CI's included, reuses it): cmake in a temporary
# folder, the binary moved into the cache folder only when the build succeeded.
$(LLAMA_SERVER_BUILT):
	rm -rf $(LLAMA_SERVER_HOME)/src $(LLAMA_SERVER_HOME)/build
	mkdir -p $(LLAMA_SERVER_HOME)/src
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: $(LLAMA_SDIST) \
	  -d $(LLAMA_SERVER_HOME)/src
	tar xzf $(LLAMA_SERVER_HOME)/src/*.tar.gz -C $(LLAMA_SERVER_HOME)/src \
	  --strip-components=3 $(LLAMA_SRC)
	cmake -S $(LLAMA_SERVER_HOME)/src -B $(LLAMA_SERVER_HOME)/build $(LLAMA_SERVER_FLAGS)
	cmake --build $(LLAMA_SERVER_HOME)/build --target llama-server -j $$(nproc)
	mv $(LLAMA_SERVER_HOME)/build/bin/llama-server $(LLAMA_SERVER_BUILT)
	rm -rf $(LLAMA_SERVER_HOME)/src $(LLAMA_SERVER_HOME)/build

$(LLAMA_SERVER): $(LLAMA_SERVER_BUILT) $(LLAMA_STAMP)
	cp $(LLAMA_SERVER_BUILT) $(LLAMA_SERVER)

# The llama-server build is tried, not required: where it cannot be built (no cmake or
# compiler), tests/test_llamacpp_server.py says so and skips; every other test still runs.
test: install llama-env
	-$(MAKE) llama-server
	$(PY) -m pytest

demo: install
	$(PY) examples/demo.py --out demo-out

bench: install
	$(PY) benchmarks/run_all.py

bench-gpu: install
	$(PY) benchmarks/bench_gpu.py

# A small qwen3_moe trained here on prose, the stdlib's code and chat questions, then its
# routing beside gpt-oss-20b's (issue #54 item 5, docs/trained-moe.md): about an hour on 2
# cores, into trained-moe/ (checkpoint, training.json) and trained-moe-traces/ (held-out
# routing). --steps fixes the weights (same steps, same bytes); --minutes only caps the wall
# time, and training.json says which one stopped it. Refused where trained-moe/ exists.
TRAIN_MOE_OUT := trained-moe
TRAIN_MOE_STEPS := 3000  # 35 minutes on 2 idle cores (docs/trained-moe.md): ends by steps
TRAIN_MOE_MINUTES := 75

train-moe: install
	nice -n 19 $(PY) benchmarks/train_moe.py --out $(TRAIN_MOE_OUT) \
	  --steps $(TRAIN_MOE_STEPS) --minutes $(TRAIN_MOE_MINUTES)
	nice -n 19 $(PY) benchmarks/moe_routing.py $(TRAIN_MOE_OUT)

lint: install
	$(VENV)/bin/ruff check placer traces solvers tests benchmarks examples

clean:
	rm -rf demo-out bench-out .pytest_cache
