# memfit: `make` builds build/memfit; `make demo` trains the default model;
# `make test` runs the whole suite (plain build, then ASan + UBSan build).
SHELL := /bin/bash
JOBS ?= $(shell nproc)
MAKEFLAGS += --no-print-directory
export MEMFIT_CACHE ?= $(HOME)/.cache/memfit

.PHONY: all deps-build deps-test data demo sft-demo test bench bench-all bench-quick docs fuzz install clean

all: build/memfit

build/memfit: deps-build
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

deps-build:
	@bash scripts/install_deps.sh build

deps-test:
	@bash scripts/install_deps.sh test

data:
	@bash scripts/fetch_data.sh

demo: build/memfit data
	./build/memfit train --config configs/demo.yaml

# supervised fine-tuning from scratch on two pinned chat data sets, scored
# by greedy answers (scripts/sft_demo.sh; README "Chat data")
sft-demo: build/memfit
	@MEMFIT_BIN=./build/memfit bash scripts/sft_demo.sh

test: deps-test data
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMEMFIT_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@bash scripts/run_tests.sh

# libFuzzer harnesses (fuzz/): each runs FUZZ_SECONDS from its seed corpus
FUZZ_SECONDS ?= 60
fuzz: build/memfit
	@bash scripts/fuzz.sh --seconds $(FUZZ_SECONDS) --out build-fuzz

bench: build/memfit data
	@bash bench/compare_torch.sh

# every benchmark docs/benchmarks.md quotes, one after another; outputs with
# date, commit, machine and load under bench-results/, then docs/benchmarks.md
# rendered from them (bench/all.sh, bench/render.py, bench/benchmarks.md.in)
bench-all: build/memfit data
	@bash bench/all.sh

# the same pipeline in minutes (fewer steps, smallest models), rendered to
# bench-results/<time>-quick/benchmarks.md only, never docs/benchmarks.md
bench-quick: build/memfit data
	@QUICK=1 bash bench/all.sh

# docs/cli.md and contrib/memfit.bash are printed by the binary from the
# config table (tests/test_docs_cli_current.sh fails when they drift)
docs: build/memfit
	./build/memfit help --markdown > docs/cli.md
	./build/memfit help --bash-completion > contrib/memfit.bash

# make install PREFIX=DIR: bin/memfit, lib/libmemfit.a, lib/libmemfit.so.N,
# include/memfit/, lib/pkgconfig/memfit.pc, bash completion (docs/library.md)
PREFIX ?= /usr/local
install: build/memfit
	@cmake --install build --prefix "$(PREFIX)"

clean:
	rm -rf build build-asan build-fuzz
