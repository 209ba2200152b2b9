# fuzz.mk - builds the libFuzzer targets fuzz/fuzz_*.c against the engine sources, with ASan + UBSan.
#   make -f fuzz/fuzz.mk [B=build-fuzz]      (normally run through fuzz/run, from `make fuzz`)
# The engine is compiled again with clang and coverage instrumentation into its
# own archive; a target links only the objects it pulls in.

B          ?= build-fuzz
FUZZ_CC    ?= clang
SAN        := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -O1 -g -fno-omit-frame-pointer -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
	       -I. -pthread -fno-strict-aliasing $(SAN)
LDLIBS     := -lm -lpcre2-8 -ljansson -luring -lseccomp -lsystemd

LIB_DIRS   := common model kern tok sample shm proto lora
LIB_SRC    := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ    := $(LIB_SRC:%.c=$(B)/obj/%.o)
# SIMD files: those with target(...) attributes, which pick instruction sets at run time
# (directly, or through kern/pack_tile_avx512.h's TGT macros).
SIMD_PAT   := [(, ]target[(]|pack_tile_avx512[.]h
PLAIN_SRC  := $(shell grep -l -E '$(SIMD_PAT)' $(LIB_SRC) /dev/null 2>/dev/null)
PLAIN_OBJ  := $(PLAIN_SRC:%.c=$(B)/obj/%.o)
PLAIN_CC   ?= gcc

# A target is built only when the code it fuzzes exists (proto/, lora/ may be added later).
need_proto        := proto/proto.c
need_safetensors  := lora/safetensors.c
FUZZ_SRC   := $(foreach f,$(wildcard fuzz/fuzz_*.c),\
		$(if $(wildcard $(need_$(patsubst fuzz/fuzz_%.c,%,$(f)))),$(f),\
		$(if $(need_$(patsubst fuzz/fuzz_%.c,%,$(f))),,$(f))))
FUZZERS    := $(patsubst fuzz/%.c,$(B)/%,$(FUZZ_SRC))

.PHONY: all list
.SECONDARY:
all: $(FUZZERS)

list:
	@echo $(patsubst $(B)/fuzz_%,%,$(FUZZERS))

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

# SIMD kernels are written for gcc (target attributes and cpu checks clang 14
# rejects) and lie on no parsing path: built plain with gcc, uninstrumented
# (fuzz/run sets NX_KERN=ref so the forward pass uses the instrumented ones).
$(PLAIN_OBJ): $(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(PLAIN_CC) -O2 -g -std=gnu11 -I. -pthread -fno-strict-aliasing -MMD -MP -c $< -o $@

$(B)/libnx-fuzz.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/fuzz_%: $(B)/obj/fuzz/fuzz_%.o $(B)/obj/fuzz/util.o $(B)/libnx-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@ $(LDLIBS)

-include $(shell find $(B)/obj -name '*.d' 2>/dev/null)
