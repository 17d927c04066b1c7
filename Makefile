# kiln — see README.md. Targets: all (default), run, test, test-asan, test-gpu, bench, install,
# clean. `make test-gpu PREBUILT=1` runs already-built GPU tests without building (for machines
# that have a GPU but no Lua/Check headers: build here, carry build/, run there).

BUILD     ?= build
CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
CC        ?= cc
SAN       ?=

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
               -O2 -g -I. -Iinclude -I/usr/include/lua5.4 -I$(CUDA_HOME)/include
ifneq ($(SAN),)
CFLAGS_BASE += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS     += -fsanitize=address,undefined
endif
CFLAGS ?=
ALL_CFLAGS := $(CFLAGS_BASE) $(CFLAGS) -MMD -MP

# Lua statically (the GPU machine has no Lua); NVRTC dynamically from the toolkit; libcuda by dlopen.
LIBS := -Wl,-Bstatic -llua5.4 -Wl,-Bdynamic -L$(CUDA_HOME)/lib64 -lnvrtc -Wl,-rpath,$(CUDA_HOME)/lib64 \
        -ldl -lm -lpthread
TEST_LIBS := -Wl,-Bstatic -lcheck -lsubunit -Wl,-Bdynamic -lrt

LIB_DIRS := base frontend ir codegen cache runtime
LIB_SRCS := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/templates.o
TEMPLATES := $(sort $(wildcard templates/*.lua))

TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_SRCS := $(wildcard tests/gpu/test_*.c)
GPU_TEST_BINS := $(GPU_TEST_SRCS:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
TEST_SUPPORT := $(BUILD)/obj/tests/support.o

.PHONY: all run test test-build test-asan test-gpu test-gpu-build bench install clean deps
all: $(BUILD)/kiln $(BUILD)/libkiln.a

deps:
	@scripts/install-deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/embed: tools/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall $< -o $@

$(BUILD)/gen/templates.c: $(BUILD)/embed $(TEMPLATES)
	@mkdir -p $(dir $@)
	$(BUILD)/embed $@ $(TEMPLATES)

$(BUILD)/obj/gen/templates.o: $(BUILD)/gen/templates.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/libkiln.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

TOOL_SRCS := $(filter-out tools/embed.c,$(wildcard tools/*.c))
$(BUILD)/kiln: $(TOOL_SRCS:%.c=$(BUILD)/obj/%.o) $(BUILD)/libkiln.a
	$(CC) $(LDFLAGS) $^ $(LIBS) -o $@

$(TEST_BINS): $(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT) $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(TEST_LIBS) $(LIBS) -o $@

$(GPU_TEST_BINS): $(BUILD)/tests/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(BUILD)/obj/tests/gpu/gpu_support.o $(TEST_SUPPORT) $(BUILD)/libkiln.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(TEST_LIBS) $(LIBS) -o $@

# The main job: install what is missing, build, compile an example with its CUDA dumped, run it
# when a GPU is present.
run: deps
	@$(MAKE) --no-print-directory all
	@scripts/run-example.sh $(BUILD)/kiln

test-build: all $(TEST_BINS)

test: deps
	@$(MAKE) --no-print-directory test-build
	@scripts/run-tests.sh $(BUILD) $(TEST_BINS)

test-asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan SAN=1 test-build
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0 \
	 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	 scripts/run-tests.sh build-asan $(patsubst $(BUILD)/%,build-asan/%,$(TEST_BINS))

test-gpu-build: all $(GPU_TEST_BINS)

ifeq ($(PREBUILT),)
test-gpu: test-gpu-build
endif
# In parallel: sequentially the GPU programs take more than 10 minutes, mostly NVRTC.
test-gpu:
	@scripts/run-tests-parallel.sh $(BUILD) $(GPU_TEST_BINS)

bench:
	@echo "make bench: not implemented yet (issue 9)"; exit 1

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	           $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(BUILD)/kiln $(DESTDIR)$(PREFIX)/bin/kiln
	install -m 644 $(BUILD)/libkiln.a $(DESTDIR)$(PREFIX)/lib/libkiln.a
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/kiln.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(shell sed -n 's/^#define KILN_VERSION "\(.*\)"/\1/p' include/kiln.h)|g' \
	    -e 's|@CUDA_HOME@|$(CUDA_HOME)|g' scripts/kiln.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kiln.pc

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
