/* quant_dispatch.c - the kernels the engine uses: the scalar reference, with
 * the SIMD kernel sets kern/cpu.c picks for the dot family laid over it.
 *
 * A SIMD set lives in its own file (kern/x86_avx2.c, kern/x86_avx512.c, ...)
 * and exports
 *   void nx_kern_<set>_install(struct nx_type_traits *tab, size_t n);
 *       replaces the dequant / quant / quant2 / dot / dot_rows pointers it implements in
 *       tab, indexed by type id (n entries). It must not change a block layout or
 *       a vec_dot_type: a SIMD kernel computes the same thing as the reference.
 *       dot and dot_rows are swapped together (dot_rows is bit-identical to dot).
 * What a set needs of the CPU is its row in kern/cpu.c's table. The sets are
 * laid over the reference weakest first, up to the one picked: a later set
 * overrides what an earlier one installed, so an avx512 set only needs the
 * kernels it does better than avx2. */
#include "kern/quant.h"

#include "kern/cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void nx_kern_avx2_install(struct nx_type_traits *tab, size_t n);
void nx_kern_avx512_install(struct nx_type_traits *tab, size_t n);

static void (*const install[NX_KSET_N])(struct nx_type_traits *tab, size_t n) = {
	[NX_KSET_AVX2] = nx_kern_avx2_install,
	[NX_KSET_AVX512] = nx_kern_avx512_install,
};

/* Type ids the table covers; nx_type_ref knows which of them exist. */
#define N_IDS 64

static struct nx_type_traits table[N_IDS];
static bool present[N_IDS];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
	for (uint32_t t = 0; t < N_IDS; t++) {
		const struct nx_type_traits *ref = nx_type_ref((enum nx_type)t);
		if (ref) {
			table[t] = *ref;
			present[t] = true;
		}
	}

	const enum nx_kset top = nx_kern_set(NX_KFAM_DOT);
	for (int k = NX_KSET_REF + 1; k <= (int)top; k++) {
		struct nx_type_traits before[N_IDS];
		memcpy(before, table, sizeof(table));
		install[k](table, N_IDS);
		/* dot_rows must stay bit-identical to dot: a set swaps both or neither. */
		for (uint32_t t = 0; t < N_IDS; t++)
			if ((table[t].dot != before[t].dot) != (table[t].dot_rows != before[t].dot_rows))
				abort();
	}

	/* A set may only swap kernels; layouts and activation types are fixed. */
	for (uint32_t t = 0; t < N_IDS; t++) {
		if (!present[t])
			continue;
		const struct nx_type_traits *ref = nx_type_ref((enum nx_type)t);
		if (table[t].blck != ref->blck || table[t].type_size != ref->type_size ||
		    table[t].vec_dot_type != ref->vec_dot_type || !table[t].dequant != !ref->dequant ||
		    !table[t].quant != !ref->quant || !table[t].dot != !ref->dot ||
		    !table[t].dot_rows != !ref->dot_rows || !table[t].quant2 != !ref->quant2)
			abort();
	}
}

const struct nx_type_traits *nx_type_get(enum nx_type t)
{
	pthread_once(&table_once, table_init);
	if ((uint32_t)t >= N_IDS || !present[t])
		return NULL;
	return &table[t];
}
