# weightbridge — top-level build.
#
#   make            libraries and programs into build/ (CUDA=auto|0|1)
#   make test       installs missing deps, builds with ASan+UBSan into build/asan, runs every test
#   make demo       installs missing deps, builds, runs the main job on a small built-in example
#   make bench      builds the benchmarks (build/bench/)
#   make install PREFIX=/usr/local
#   make python     the Python package with libweightbridge.so inside, into build/python
#   make fresh-check the README's commands in a fresh Debian 12 root (debootstrap; root, a mirror)
#   make overload   builds, runs the overload case (64 agents, two busy loops for 60 s, kill -9)
#   make soak       builds, runs the soak test (thousands of versions, faults injected, <= 10 min)
#
# Sources are found by convention, so a part never edits this file to add a file:
#   <part>/*.c, <part>/<sub>/*.c     -> libweightbridge.a
#   *_cuda.c, *.cu                   -> only when building with CUDA
#   *_nocuda.c                       -> only when building without CUDA
#   <part>/bin/<prog>.c              -> build/bin/<prog>
#   tests/{unit,func}/<name>_test.c  -> build/tests/<name> (linked with tests/wbtest.c);
#                                       <name>_cuda_test.c only when building with CUDA
#   tests/sh/<name>_test.sh          -> build/tests/<name> (a script printing the same tally)
#   bench/<name>.c                   -> build/bench/<name>
#   tests/fuzz/<name>_fuzz.c         -> build/fuzz/fuzzers/<name> (make fuzz: clang + libFuzzer)
#   make fault                       -> build/fault: ASan+UBSan, -DWB_FAULT, our allocations
#                                       countable (common/fault.h; tests/sh/fault_test.sh)

PARTS   := common proto route matcher planner quant ckpt transport agent controller bcast
PREFIX  ?= /usr/local
CUDA    ?= auto
SAN     ?= 0
FAULT   ?= 0
BUILD   ?= build

CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wstrict-prototypes -Wno-missing-field-initializers
OPT     ?= -O2 -g
CFLAGS_ALL := $(CSTD) $(WARN) $(OPT) -MMD -MP -I. -fPIC $(CFLAGS)
# libfabric is not linked: transport/fabric/fabric_dl.c loads it at the first fabric open (its
# Debian build's PSM libraries install signal handlers when loaded). Tests and benchmarks that
# call libfabric themselves link it (FABRIC_LIB, kept only where used by --as-needed).
LIBS    := -libverbs -lnng -lmsgpackc -lyaml -ljansson -lxxhash -lpthread -lm -ldl
FABRIC_LIB := -lfabric

ifeq ($(SAN),1)
CFLAGS_ALL += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDSAN   := -fsanitize=address,undefined
endif
# The fuzzing build (make fuzz): clang, coverage for libFuzzer in every object, ASan + UBSan.
ifeq ($(SAN),fuzz)
CFLAGS_ALL += -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
LDSAN   := -fsanitize=address,undefined
endif
# The fault-injection build (make fault): the hooks of common/fault.h compiled in, and every
# allocation call in our own objects renamed to common/fault.c's wrapper (objcopy
# --redefine-sym on each object, not ld --wrap: that would also count the allocations of the
# static CUDA runtime linked into the programs). Shared libraries — libfabric, nng, libyaml —
# and the CUDA runtime allocate as always.
ifeq ($(FAULT),1)
CFLAGS_ALL += -DWB_FAULT
WRAPPED := malloc calloc realloc strdup strndup posix_memalign aligned_alloc asprintf vasprintf \
           open_memstream
FAULT_REDEF = $(if $(filter %/common/fault.o,$@),,objcopy $(foreach f,$(WRAPPED),--redefine-sym $(f)=__wrap_$(f)) $@)
KEEPSYM := --keep-global-symbol='__wrap_*'
endif

# The builds that test, demo, fault and fuzz start use every core (make test on a 2-core machine
# built on one), unless this make was given -j itself: its sub-makes share its job slots then.
# Each target's output is printed whole (--output-sync), so parallel errors stay readable.
NPROC   := $(shell nproc 2>/dev/null || echo 1)
SUBMAKE = $(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j$(NPROC)) \
          --output-sync=target

# ---- CUDA: auto uses nvcc when it can be found
NVCC_FOUND := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(CUDA),auto)
  ifneq ($(NVCC_FOUND),)
    override CUDA := 1
  else
    override CUDA := 0
  endif
endif
ifeq ($(CUDA),1)
  NVCC     ?= $(if $(NVCC_FOUND),$(NVCC_FOUND),nvcc)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  NVFLAGS  := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
              -Xcompiler -fPIC,-Wall -I. -MMD -MP $(if $(filter 1,$(FAULT)),-DWB_FAULT)
  CFLAGS_ALL += -I$(CUDA_HOME)/include
  LIBS     += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
  CUDA_EXCL := %_nocuda.c %_nocuda_test.c
else
  CUDA_EXCL := %_cuda.c %_cuda_test.c
endif

LIB_C   := $(filter-out %_test.c $(CUDA_EXCL),$(foreach p,$(PARTS),$(wildcard $(p)/*.c) \
             $(filter-out $(p)/bin/%,$(wildcard $(p)/*/*.c))))
LIB_CU  := $(if $(filter 1,$(CUDA)),$(foreach p,$(PARTS),$(wildcard $(p)/*.cu $(p)/*/*.cu)))
PROG_C  := $(foreach p,$(PARTS),$(wildcard $(p)/bin/*.c))
TEST_C  := $(filter-out $(CUDA_EXCL),$(wildcard tests/unit/*_test.c tests/func/*_test.c))
TEST_SH := $(wildcard tests/sh/*_test.sh)
BENCH_C := $(wildcard bench/*.c)
FUZZ_C  := $(wildcard tests/fuzz/*_fuzz.c)

# Objects depend on the build's configuration, so switching CUDA/SAN/OPT rebuilds everything.
CONFIG_ID := cuda=$(CUDA) san=$(SAN) fault=$(FAULT)$(if $(WRAPPED),:$(WRAPPED)) opt=$(OPT) cflags=$(CFLAGS)
CONFIG    := $(BUILD)/config
$(shell mkdir -p $(BUILD) && (echo '$(CONFIG_ID)' | cmp -s - $(CONFIG) || echo '$(CONFIG_ID)' > $(CONFIG)))

OBJ     := $(BUILD)/obj
LIB     := $(BUILD)/lib/libweightbridge.a
LIB_INT := $(BUILD)/lib/libweightbridge-internal.a
SOLIB   := $(BUILD)/lib/libweightbridge.so
LIB_O   := $(LIB_C:%.c=$(OBJ)/%.o) $(LIB_CU:%.cu=$(OBJ)/%.cu.o)
PROGS   := $(foreach f,$(PROG_C),$(BUILD)/bin/$(basename $(notdir $(f))))
TESTS   := $(foreach f,$(TEST_C),$(BUILD)/tests/$(patsubst %_test.c,%,$(notdir $(f)))) \
           $(foreach f,$(TEST_SH),$(BUILD)/tests/$(patsubst %_test.sh,%,$(notdir $(f))))
BENCHES := $(foreach f,$(BENCH_C),$(BUILD)/bench/$(basename $(notdir $(f))))
FUZZERS := $(foreach f,$(FUZZ_C),$(BUILD)/fuzzers/$(patsubst %_fuzz.c,%,$(notdir $(f))))
HEADERS := $(foreach p,$(PARTS),$(wildcard $(p)/$(p).h)) common/fpbits.h

.PHONY: all lib progs test tests bench fuzz fuzzers fault demo soak overload deps install python \
        fresh-check clean format check-format
.DEFAULT_GOAL := all

all: lib progs

lib: $(LIB) $(SOLIB)
progs: $(PROGS)
tests: $(TESTS)
bench: $(BENCHES)

deps:
	@scripts/deps.sh

$(OBJ)/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@
	$(FAULT_REDEF)

$(OBJ)/%.cu.o: %.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
	$(FAULT_REDEF)

# The library users link is one relocatable object whose only global symbols are the wb_ API:
# functions shared between the files of a part (private prefixes such as pl_, ag_, fab_, and
# what nvcc generates) are made local, so nothing of ours can collide with a symbol of the
# process weightbridge is linked into. tests/sh/symbols_test.sh checks it. DW.ref.* stay: they
# are the compiler's weak, hidden references to the C++ exception personality, which a static
# libstdc++ resolves against the same name (never exported from a shared object).
$(LIB): $(LIB_O)
	@mkdir -p $(dir $@)
	@rm -f $@ $(BUILD)/lib/weightbridge.o
	$(LD) -r -o $(BUILD)/lib/weightbridge.o $^
	objcopy --wildcard --keep-global-symbol='wb_*' --keep-global-symbol='DW.ref.*' $(KEEPSYM) \
	  $(BUILD)/lib/weightbridge.o
	ar rcs $@ $(BUILD)/lib/weightbridge.o

# The shared library (for Python and for programs that load it): the same objects, the wb_ API
# exported by a version script, the dependencies recorded as its own.
$(SOLIB): $(LIB_O) scripts/weightbridge.map
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ -Wl,-soname,libweightbridge.so.0 -Wl,--version-script=scripts/weightbridge.map \
	  -Wl,--no-undefined $(LDSAN) $(LIB_O) $(LIBS)

# Tests may reach a part's internals (planner_stamp_test builds plans with templates off), so
# they link the objects as compiled.
$(LIB_INT): $(LIB_O)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

# Programs: <part>/bin/<prog>.c. A program links the objects it uses from the internal
# archive, and only the shared libraries those need (--as-needed). None links libfabric (see
# LIBS): wb-plan and wb-match never load it, whose Debian build pulls in PSM libraries that
# calibrate a clock for 0.2 s in a constructor at every start.
ASNEEDED := -Wl,--as-needed
define prog_rule
$(BUILD)/bin/$(basename $(notdir $(1))): $(OBJ)/$(1:.c=.o) $(LIB_INT)
	@mkdir -p $$(dir $$@)
	$(CC) $(LDSAN) -o $$@ $$^ $(ASNEEDED) $(LIBS)
endef
$(foreach f,$(PROG_C),$(eval $(call prog_rule,$(f))))

define test_rule
$(BUILD)/tests/$(patsubst %_test.c,%,$(notdir $(1))): $(OBJ)/$(1:.c=.o) $(OBJ)/tests/wbtest.o $(LIB_INT)
	@mkdir -p $$(dir $$@)
	$(CC) $(LDSAN) -o $$@ $$^ $(ASNEEDED) $(LIBS) $(FABRIC_LIB)
endef
$(foreach f,$(TEST_C),$(eval $(call test_rule,$(f))))

# Script tests check the built library (symbols) or the sources (layering); the library is a
# prerequisite so that the symbol check always sees the current one.
$(BUILD)/tests/%: tests/sh/%_test.sh $(LIB) $(SOLIB)
	@mkdir -p $(dir $@)
	install -m 755 $< $@

define fuzz_rule
$(BUILD)/fuzzers/$(patsubst %_fuzz.c,%,$(notdir $(1))): $(OBJ)/$(1:.c=.o) $(LIB_INT)
	@mkdir -p $$(dir $$@)
	$(CC) -fsanitize=fuzzer,address,undefined -o $$@ $$^ $(LIBS)
endef
$(foreach f,$(FUZZ_C),$(eval $(call fuzz_rule,$(f))))
fuzzers: $(FUZZERS)

# The fuzz targets, built with clang into build/fuzz (scripts/fuzz.sh runs them).
fuzz:
	+@$(SUBMAKE) CC=clang CUDA=0 SAN=fuzz BUILD=$(BUILD)/fuzz OPT="-O1 -g" fuzzers

# The fault-injection build into build/fault (tests/sh/fault_test.sh runs its programs).
fault:
	+@$(SUBMAKE) SAN=1 FAULT=1 BUILD=$(BUILD)/fault OPT="-O1 -g" progs

define bench_rule
$(BUILD)/bench/$(basename $(notdir $(1))): $(OBJ)/$(1:.c=.o) $(LIB_INT)
	@mkdir -p $$(dir $$@)
	$(CC) $(LDSAN) -o $$@ $$^ $(ASNEEDED) $(LIBS) $(FABRIC_LIB)
endef
$(foreach f,$(BENCH_C),$(eval $(call bench_rule,$(f))))

# The test build: sanitizers on, its own directory so it never mixes with the release objects.
# ASAN_OPTIONS: CUDA's runtime maps memory where ASan keeps its shadow gap; leak checking stays on.
# The fault-injection programs (build/fault) are built too: tests/sh/fault_test.sh runs them.
test: deps
	+@$(SUBMAKE) SAN=1 BUILD=$(BUILD)/asan OPT="-O1 -g" tests progs
	+@$(SUBMAKE) fault
	@ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 WB_BIN=$(BUILD)/asan/bin WB_FAULT_BIN=$(BUILD)/fault/bin \
	  tests/run.sh $(BUILD)/asan/tests

demo: deps
	+@$(SUBMAKE) all
	@scripts/demo.sh $(BUILD)

# The soak test (issue #27; tests/sh/soak.sh --help): the demo job for SOAK_VERSIONS versions
# with a fault (kill -9 of a trainer, a rollout or the controller, SIGSTOP of an agent) injected
# mid-transfer every ~30, every byte of every complete version verified, at most 10 minutes.
# More options: make soak SOAK_ARGS="--seed 7". tests/sh/soak_test.sh (make test) is the short form.
SOAK_VERSIONS ?= 2000
soak: deps
	@$(MAKE) --no-print-directory all
	@tests/sh/soak.sh --build $(BUILD) --versions $(SOAK_VERSIONS) --fault-every 30 --minutes 10 \
	  $(SOAK_ARGS)

# The overload case of issue #28 (tests/sh/overload_test.sh --help): 64 agents of one job on
# this machine with default settings; their idle cost; two busy loops for 60 s while versions
# run, each verified; kill -9 of a trainer mid-transfer failed by the controller within 1 s.
# tests/sh/overload_test.sh in make test is the short form (20 s of busy loops, times printed).
overload: deps
	@$(MAKE) --no-print-directory all
	@WB_BIN=$(BUILD)/bin tests/sh/overload_test.sh --hog-seconds 60 --kill-limit-ms 1000

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/weightbridge \
	  $(DESTDIR)$(PREFIX)/share/weightbridge
	$(if $(PROGS),install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/)
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SOLIB) $(DESTDIR)$(PREFIX)/lib/libweightbridge.so.0
	ln -sf libweightbridge.so.0 $(DESTDIR)$(PREFIX)/lib/libweightbridge.so
	for h in $(HEADERS); do install -D -m 644 $$h $(DESTDIR)$(PREFIX)/include/weightbridge/$$h; done
	cp -R configs $(DESTDIR)$(PREFIX)/share/weightbridge/
	install -d $(DESTDIR)$(PREFIX)/share/weightbridge/semantic
	install -m 644 $(wildcard matcher/semantic/*.py) $(DESTDIR)$(PREFIX)/share/weightbridge/semantic/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBS@|$(LIBS)|' scripts/weightbridge.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/weightbridge.pc

# The Python package carrying this build's library (python/setup.py tags a wheel of it for the
# platform): `pip install build/python` into a venv needs no $WB_LIBRARY, rpath or `make install`
# (the README's install). The copy is remade whole, so no stale file of an earlier one is kept.
python: $(SOLIB)
	rm -rf $(BUILD)/python
	mkdir -p $(BUILD)/python
	cp -R python/pyproject.toml python/setup.py python/README.md python/weightbridge $(BUILD)/python/
	rm -rf $(BUILD)/python/weightbridge/__pycache__
	cp $(SOLIB) $(BUILD)/python/weightbridge/libweightbridge.so

# The README's commands as written (make, make demo, the Python install, the first job) in a
# Debian 12 root debootstrap makes (scripts/fresh_debian_check.sh --help); about 90 s and 230 MB
# of downloads, so opt-in: make test runs it only with WB_FRESH_CHECK=1.
fresh-check:
	@scripts/fresh_debian_check.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

check-format:
	@clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD)

-include $(LIB_O:.o=.d) $(PROG_C:%.c=$(OBJ)/%.d) $(TEST_C:%.c=$(OBJ)/%.d) $(BENCH_C:%.c=$(OBJ)/%.d) \
         $(FUZZ_C:%.c=$(OBJ)/%.d) $(OBJ)/tests/wbtest.d
