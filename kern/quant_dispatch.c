/* quant_dispatch.c - the kernels the engine uses: the scalar reference, with
 * every SIMD kernel set the CPU can run laid over it (chosen once, by CPUID).
 *
 * A SIMD set lives in its own file (kern/x86_avx2.c, kern/x86_avx512.c, ...)
 * and exports two functions:
 *   bool nx_kern_<set>_usable(void);
 *       true when this CPU and OS can run it (e.g. __builtin_cpu_supports("avx2")
 *       && __builtin_cpu_supports("fma"));
 *   void nx_kern_<set>_install(struct nx_type_traits *tab, size_t n);
 *       replaces the dequant / quant / quant2 / dot / dot_rows pointers it implements in
 *       tab, indexed by type id (n entries). It must not change a block layout or
 *       a vec_dot_type: a SIMD kernel computes the same thing as the reference.
 *       dot and dot_rows are swapped together (dot_rows is bit-identical to dot).
 * Adding a set is one line in NX_KERN_SETS below, weakest first: a later set
 * overrides what an earlier one installed, so an avx512 set only needs the
 * kernels it does better than avx2.
 *
 * NX_KERN=ref in the environment forces the reference kernels; NX_KERN=<set>
 * stops after that set (to test a weaker set on a stronger CPU). */
#include "kern/quant.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The list of SIMD sets, e.g.  X(avx2) X(avx512)  */
#define NX_KERN_SETS(X) X(avx2) X(avx512)

#define NX_KERN_DECLARE(set)                \
	bool nx_kern_##set##_usable(void);  \
	void nx_kern_##set##_install(struct nx_type_traits *tab, size_t n);
#define NX_KERN_ROW(set) { #set, nx_kern_##set##_usable, nx_kern_##set##_install },

NX_KERN_SETS(NX_KERN_DECLARE)

struct kern_set {
	const char *name;
	bool (*usable)(void);
	void (*install)(struct nx_type_traits *tab, size_t n);
};

static const struct kern_set kern_sets[] = {
	{ "ref", NULL, NULL },
	NX_KERN_SETS(NX_KERN_ROW)
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

	const char *want = getenv("NX_KERN");
	if (want && !strcmp(want, "ref"))
		return;
	for (size_t i = 1; i < sizeof(kern_sets) / sizeof(kern_sets[0]); i++) {
		const struct kern_set *ks = &kern_sets[i];
		if (!ks->usable())
			break; /* sets are ordered by what they need: the rest need more */
		struct nx_type_traits before[N_IDS];
		memcpy(before, table, sizeof(table));
		ks->install(table, N_IDS);
		/* dot_rows must stay bit-identical to dot: a set swaps both or neither. */
		for (uint32_t t = 0; t < N_IDS; t++)
			if ((table[t].dot != before[t].dot) != (table[t].dot_rows != before[t].dot_rows))
				abort();
		if (want && !strcmp(want, ks->name))
			break;
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
