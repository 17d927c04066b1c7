# Fuzz targets (docs/fuzzing.md): libFuzzer with clang, AddressSanitizer and UndefinedBehavior-
# Sanitizer. Included by the Makefile. `make fuzz FUZZ_SECONDS=N` builds the library and every
# target in build-fuzz/ and runs each for N seconds on a scratch copy of its corpus
# (scripts/fuzz.sh; FUZZ_JOBS=N runs N processes per target, for long campaigns).
#
# The outer make calls itself with BUILD=$(FUZZ_BUILD) and the fuzzing flags, so the library's
# objects come from the Makefile's own rules: instrumented for coverage (fuzzer-no-link) and the
# sanitizers. Lua is linked statically and NVRTC from $(CUDA_HOME)/lib64 as for build/kiln, so
# the binaries run on a machine without Lua or clang.

FUZZ_BUILD   ?= build-fuzz
FUZZ_CC      ?= $(shell command -v clang-14 >/dev/null 2>&1 && echo clang-14 || echo clang)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := fuzz_gguf fuzz_kg fuzz_bundle fuzz_cache fuzz_compile fuzz_text fuzz_request
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz/%) $(FUZZ_BUILD)/fuzz/fuzz_seeds

.PHONY: fuzz fuzz-build fuzz-bins fuzz-clean

fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_TARGETS)

fuzz-build:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) \
	    CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" LDFLAGS="$(FUZZ_SAN)" fuzz-bins

fuzz-bins: $(FUZZ_BINS)

# Each target: one tests/fuzz/fuzz_NAME.c, its LLVMFuzzerTestOneInput over libkiln.a.
$(FUZZ_BUILD)/fuzz/fuzz_%: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_%.o $(FUZZ_BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer $^ $(LIBS) -o $@

# The seed writer (its own main): fresh GGUF, bundle, cache and plan seeds from this build.
$(FUZZ_BUILD)/fuzz/fuzz_seeds: $(FUZZ_BUILD)/obj/tests/fuzz/fuzz_seeds.o $(FUZZ_BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LIBS) -o $@

clean: fuzz-clean
fuzz-clean:
	rm -rf $(FUZZ_BUILD)
