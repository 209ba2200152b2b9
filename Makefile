# nxd - build, fetch the default model, test.
#   make            build/nxd, build/nxctl and the engine tools
#   make test       install what is missing, build, fetch the model, run every test
#   make model      fetch the default model into the cache (prints its path)
#   make run        start nxd on the default model and ask it a question with nxctl

CC      ?= cc
CFLAGS  ?= -O2 -g
# override: `make CFLAGS='-O1 -fsanitize=address'` replaces the optimization, not these.
override CFLAGS += -fPIC -std=gnu11 -Wall -Wextra -Wno-unused-parameter -I. -pthread -fno-strict-aliasing
LDLIBS  += -lm -lpcre2-8 -ljansson -luring -lseccomp -lsystemd
B       := build

# The engine: everything but programs and tests.
LIB_DIRS := common model kern tok sample shm proto lora
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(B)/obj/%.o)

TOOLS    := $(patsubst tools/%.c,$(B)/%,$(wildcard tools/*.c))
CTESTS   := $(patsubst tests/c/%.c,$(B)/tests/%,$(wildcard tests/c/test_*.c))
PROGRAMS := $(if $(wildcard daemon/*.c),$(B)/nxd) $(if $(wildcard client/*.c),$(B)/nxctl) \
	    $(if $(wildcard http/*.c),$(B)/nxd-http)

.PHONY: all deps venv model run test test-c test-py attack clean install uninstall
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

# libedit (BSD-licensed): chat's line editing and history.
$(B)/nxctl: $(patsubst %.c,$(B)/obj/%.o,$(wildcard client/*.c)) $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -ledit

# The HTTP gateway: a client of nxd's socket (libmicrohttpd parses HTTP, never the supervisor).
$(B)/nxd-http: $(patsubst %.c,$(B)/obj/%.o,$(wildcard http/*.c)) $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lmicrohttpd

$(B)/%: $(B)/obj/tools/%.o $(B)/libnx.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# Made through a pattern, the tools' and C tests' objects would be deleted as intermediates, and built again
# by the next make.
.SECONDARY: $(patsubst tools/%.c,$(B)/obj/tools/%.o,$(wildcard tools/*.c)) \
	$(patsubst tests/c/%.c,$(B)/obj/tests/c/%.o,$(wildcard tests/c/*.c))

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
	@scripts/demo "$$PROMPT" # from the environment, where make puts PROMPT=...: quotes and $ kept as typed

# C unit tests run from the repo root (they find fixtures relative to it).
test-c: all $(CTESTS)
	@set -e; for t in $(CTESTS); do echo "== $$t"; $$t; done
	@echo "== $(B)/tests/test_lora (NX_KERN=avx2: the LoRA delta's plain-vector path)"; NX_KERN=avx2 $(B)/tests/test_lora

# Then the forward pass against the float64 reference again with the kernel
# sets a CPU without AVX-512 (or without AVX2) gets from the same binary.
test-py: all venv
	NX_BUILD=$(B) NXD_MODEL=$$(scripts/fetch-model) .venv/bin/python -m pytest -q tests/py
	@set -e; for k in avx2 ref; do \
		echo "== tests/py/test_forward.py (NX_KERN=$$k: plain layouts, $$k dot kernels, scalar attention)"; \
		NX_KERN=$$k NX_BUILD=$(B) .venv/bin/python -m pytest -q tests/py/test_forward.py; done

# The attacks of tests/py/test_attack.py at full strength, with their timing targets (make test
# runs them shorter and prints the timings); run it on an otherwise idle machine.
attack: all venv
	NXD_ATTACK_N=50000 NXD_ATTACK_STRICT=1 NX_BUILD=$(B) NXD_MODEL=$$(scripts/fetch-model) .venv/bin/python -m pytest -q -s tests/py/test_attack.py

test: deps venv
	@$(MAKE) --no-print-directory all $(CTESTS)
	@$(MAKE) --no-print-directory test-c
	@$(MAKE) --no-print-directory test-py
	@$(MAKE) --no-print-directory fuzz-smoke

clean:
	rm -rf $(B)

# Install: binaries, systemd units (paths filled in), config (never overwritten), man pages.
#   make install [DESTDIR=/stage] [PREFIX=/usr/local] [UNITDIR=/etc/systemd/system]
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
SYSCONFDIR  ?= /etc
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
MANDIR      ?= $(PREFIX)/share/man
UNIT_SED    := -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

install: $(B)/nxd $(B)/nxctl $(B)/nxd-http
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(SYSCONFDIR)/nxd $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man1
	install -m 0755 $(B)/nxd $(B)/nxctl $(B)/nxd-http $(DESTDIR)$(BINDIR)/
	for u in nxd.service nxd.socket nxd-http.service nxd-http.socket; do \
		sed $(UNIT_SED) systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u && chmod 0644 $(DESTDIR)$(UNITDIR)/$$u; done
	install -m 0644 systemd/nxd.sysusers $(DESTDIR)$(SYSUSERSDIR)/nxd.conf
	install -m 0644 systemd/nxd-http.sysusers $(DESTDIR)$(SYSUSERSDIR)/nxd-http.conf
	@# The configs are the admin's once installed: never overwrite them.
	[ -e $(DESTDIR)$(SYSCONFDIR)/nxd/nxd.conf ] || install -m 0644 etc/nxd.conf $(DESTDIR)$(SYSCONFDIR)/nxd/nxd.conf
	[ -e $(DESTDIR)$(SYSCONFDIR)/nxd/nxd-http.conf ] || \
		install -m 0644 etc/nxd-http.conf $(DESTDIR)$(SYSCONFDIR)/nxd/nxd-http.conf
	install -m 0644 docs/nxd.8 $(DESTDIR)$(MANDIR)/man8/nxd.8
	install -m 0644 docs/nxctl.1 $(DESTDIR)$(MANDIR)/man1/nxctl.1
	@# On the live system (no DESTDIR): create the nxd user, tell systemd about the units.
	@if [ -z "$(DESTDIR)" ]; then \
		if command -v systemd-sysusers >/dev/null; then \
			systemd-sysusers $(SYSUSERSDIR)/nxd.conf $(SYSUSERSDIR)/nxd-http.conf; fi; \
		if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi; \
		echo "install: now 'systemctl enable --now nxd.socket' (model: NXD_MODEL in $(SYSCONFDIR)/nxd/nxd.conf)"; \
		echo "install: the HTTP gateway: 'systemctl enable --now nxd-http' (options: $(SYSCONFDIR)/nxd/nxd-http.conf)"; \
	fi

# Removes what install put in place but the config (and the nxd user and /var/lib/nxd).
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/nxd $(DESTDIR)$(BINDIR)/nxctl $(DESTDIR)$(BINDIR)/nxd-http \
		$(DESTDIR)$(UNITDIR)/nxd.service $(DESTDIR)$(UNITDIR)/nxd.socket \
		$(DESTDIR)$(UNITDIR)/nxd-http.service $(DESTDIR)$(UNITDIR)/nxd-http.socket \
		$(DESTDIR)$(SYSUSERSDIR)/nxd.conf $(DESTDIR)$(SYSUSERSDIR)/nxd-http.conf \
		$(DESTDIR)$(MANDIR)/man8/nxd.8 $(DESTDIR)$(MANDIR)/man1/nxctl.1
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)

# Side-by-side benchmark against llama.cpp (docs/bench.md), about 7 minutes on an idle machine:
#   make bench [CASES=decode,prefill,concurrent,memory,qwen,moe,chat,http,depth] [REPS=5] [BENCH_ARGS="--wait-idle 600"]
.PHONY: bench
bench: deps
	@scripts/deps bench
	@scripts/bench-venv
	@$(MAKE) --no-print-directory all $(B)/bench/bw
	.venv-bench/bin/python bench/run.py --build $(B) $(if $(CASES),--cases $(CASES)) $(if $(REPS),--reps $(REPS)) $(BENCH_ARGS)

# The bandwidth probe is built for this CPU, like the peer it is compared with.
$(B)/bench/bw: bench/bw.c
	@mkdir -p $(dir $@)
	$(CC) -O3 -march=native -std=gnu11 -Wall -Wextra -pthread $< -o $@

# Fuzzing (docs/fuzzing.md): libFuzzer + ASan/UBSan targets built with clang into build-fuzz/.
#   make fuzz [FUZZ_SECONDS=300]   each target for FUZZ_SECONDS; crashes in build-fuzz/crashes/<target>/
#   make fuzz-smoke                each target for 20 s; fails if anything is found
.PHONY: fuzz fuzz-smoke
FUZZ_SECONDS ?= 300
fuzz:
	@FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run

fuzz-smoke:
	@fuzz/run --smoke

# nxd under a live systemd (tests/systemd/smoke): make install, socket activation, systemctl
# start / stop / restart, a crash, a bad nxd.conf. Boots systemd as PID 1 of private namespaces
# (root, unshare); not part of `make test`.
.PHONY: smoke-systemd
smoke-systemd:
	@$(MAKE) --no-print-directory all
	tests/systemd/smoke

# Load and soak (tests/soak/soak.py): 40 clients on 4 slots with mixed requests for SOAK_SECONDS,
# then leak and stalled-reader checks; prints requests by kind, errors by code, RSS and fds.
#   make soak [SOAK_SECONDS=600]
.PHONY: soak
SOAK_SECONDS ?= 600
soak: deps venv
	@$(MAKE) --no-print-directory all
	NX_BUILD=$(B) NXD_MODEL=$$(scripts/fetch-model) .venv/bin/python tests/soak/soak.py --build $(B) --seconds $(SOAK_SECONDS)
