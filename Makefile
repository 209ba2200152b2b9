# nxd - build, fetch the default model, test.
#   make            build/nxd, build/nxctl and the engine tools
#   make test       install what is missing, build, fetch the model, run every test
#   make model      fetch the default model into the cache (prints its path)
#   make run        start nxd on the default model and ask it a question with nxctl

CC      ?= cc
CFLAGS  ?= -O2 -g
CFLAGS  += -fPIC -std=gnu11 -Wall -Wextra -Wno-unused-parameter -I. -pthread -fno-strict-aliasing
LDLIBS  += -lm -lpcre2-8 -ljansson -luring -lseccomp -lsystemd
B       := build

# The engine: everything but programs and tests.
LIB_DIRS := common model kern tok sample shm proto
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/obj/%.o)

TOOLS    := $(patsubst tools/%.c,$(B)/%,$(wildcard tools/*.c))
CTESTS   := $(patsubst tests/c/%.c,$(B)/tests/%,$(wildcard tests/c/test_*.c))
PROGRAMS := $(if $(wildcard daemon/*.c),$(B)/nxd) $(if $(wildcard client/*.c),$(B)/nxctl)

.PHONY: all deps venv model run test test-c test-py clean
all: $(B)/libnx.a $(B)/libnx.so $(PROGRAMS) $(TOOLS)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/libnx.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# Shared library for the Python tests (ctypes) to call the engine directly.
$(B)/libnx.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared $^ -o $@ $(LDLIBS)

$(B)/nxd: $(patsubst %.c,$(B)/obj/%.o,$(wildcard daemon/*.c worker/*.c)) $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/nxctl: $(patsubst %.c,$(B)/obj/%.o,$(wildcard client/*.c)) $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/%: $(B)/obj/tools/%.o $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(B)/tests/%: $(B)/obj/tests/c/%.o $(B)/libnx.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

deps:
	@scripts/deps

venv: deps
	@scripts/venv

model: venv
	@scripts/fetch-model

run: deps venv
	@$(MAKE) --no-print-directory all
	@scripts/demo "$(PROMPT)"

# C unit tests run from the repo root (they find fixtures relative to it).
test-c: all $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "== $$t"; $$t; done

test-py: all venv
	NX_BUILD=$(B) NXD_MODEL=$$(scripts/fetch-model) .venv/bin/python -m pytest -q tests/py

test: deps venv
	@$(MAKE) --no-print-directory all $(CTESTS)
	@$(MAKE) --no-print-directory test-c
	@$(MAKE) --no-print-directory test-py

clean:
	rm -rf $(B)

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
