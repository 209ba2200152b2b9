/* model.c - puts the model file where the workers will find it (io_uring reads into private huge pages, or a read-only MAP_SHARED mapping) and validates it. */
#define _GNU_SOURCE
#include "daemon/nxd.h"

#include "kern/cpu.h"
#include "kern/pack.h"
#include "model/repack.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define LOAD_CHUNK ((size_t)8 << 20) /* bytes per IORING_OP_READ */
#define LOAD_DEPTH 4                 /* reads in flight */

/* Opens path as the model: a non-empty regular file outside /proc and /sys
 * (a FIFO would block the open without O_NONBLOCK, a device or a /proc entry
 * has no stable size). */
static int open_model(const char *path, size_t *size, struct nx_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return nx_errf(err, "model: cannot open %s: %s", path, strerror(errno));
	struct stat st;
	struct statfs sf;
	if (fstat(fd, &st) < 0) {
		nx_errf(err, "model: fstat(%s) failed: %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		nx_errf(err, "model: %s is not a regular file", path);
		goto fail;
	}
	if (fstatfs(fd, &sf) == 0 && (sf.f_type == PROC_SUPER_MAGIC || sf.f_type == SYSFS_MAGIC)) {
		nx_errf(err, "model: %s is in /proc or /sys, not a model file", path);
		goto fail;
	}
	if (st.st_size <= 0) {
		nx_errf(err, "model: %s is empty", path);
		goto fail;
	}
	*size = (size_t)st.st_size;
	return fd;
fail:
	close(fd);
	return -1;
}

/* Reads the whole file into dst with IORING_OP_READ, LOAD_DEPTH chunks in
 * flight. IOSQE_ASYNC hands each read to io_uring's worker threads: a read
 * the page cache can serve is otherwise a copy done inline by this thread,
 * one chunk after another; the workers copy on every CPU (docs/bench.md,
 * "Measurements behind choices"). */
static int uring_read_all(int fd, uint8_t *dst, size_t size, const char *path, struct nx_err *err)
{
	struct io_uring ring;
	int rc = io_uring_queue_init(LOAD_DEPTH * 2, &ring, 0);
	if (rc < 0)
		return nx_errf(err, "model: io_uring_queue_init failed: %s", strerror(-rc));
	struct { size_t off, len; } job[LOAD_DEPTH];
	bool busy[LOAD_DEPTH] = { false };
	size_t next = 0, done = 0;
	int inflight = 0, ret = 0;
	while (done < size) {
		for (int j = 0; j < LOAD_DEPTH && next < size; j++) {
			if (busy[j])
				continue;
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			if (!sqe)
				break;
			job[j].off = next;
			job[j].len = size - next < LOAD_CHUNK ? size - next : LOAD_CHUNK;
			next += job[j].len;
			io_uring_prep_read(sqe, fd, dst + job[j].off, (unsigned)job[j].len, job[j].off);
			io_uring_sqe_set_data64(sqe, (uint64_t)j);
			io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
			busy[j] = true;
			inflight++;
		}
		rc = io_uring_submit_and_wait(&ring, 1);
		if (rc < 0 && rc != -EINTR) {
			ret = nx_errf(err, "model: io_uring_submit_and_wait failed: %s", strerror(-rc));
			break;
		}
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, cqe)
		{
			int j = (int)io_uring_cqe_get_data64(cqe);
			seen++;
			inflight--;
			if (cqe->res < 0) {
				ret = nx_errf(err, "model: reading %s at offset %zu failed: %s", path, job[j].off,
					      strerror(-cqe->res));
				continue;
			}
			if (cqe->res == 0) {
				ret = nx_errf(err, "model: %s shrank while being read (EOF at %zu of %zu bytes)",
					      path, job[j].off, size);
				continue;
			}
			size_t got = (size_t)cqe->res;
			done += got;
			job[j].off += got;
			job[j].len -= got;
			if (job[j].len == 0) {
				busy[j] = false;
				continue;
			}
			/* Short read: ask for the rest of the chunk. */
			struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
			if (!sqe) {
				ret = nx_errf(err, "model: io_uring submission queue full");
				continue;
			}
			io_uring_prep_read(sqe, fd, dst + job[j].off, (unsigned)job[j].len, job[j].off);
			io_uring_sqe_set_data64(sqe, (uint64_t)j);
			io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
			inflight++;
		}
		io_uring_cq_advance(&ring, seen);
		if (ret < 0)
			break;
	}
	/* On error, drain what is still in flight before the ring (and dst) go. */
	while (inflight > 0) {
		struct io_uring_cqe *cqe;
		if (io_uring_wait_cqe(&ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(&ring, cqe);
		inflight--;
	}
	io_uring_queue_exit(&ring);
	return ret;
}

/* One line on the pages the weights got: on 4 KiB ones decode is 10-20% slower
 * (TLB misses while streaming them), and the cause is the system's setting. */
static void log_pages(const struct nx_huge *h)
{
	long long huge = nx_huge_resident(h->p, h->len);
	double mib = (double)h->len / 1048576;
	if (h->advise_errno)
		nxd_info("model: madvise(MADV_HUGEPAGE) failed: %s; the weights are on 4 KiB pages",
			 strerror(h->advise_errno));
	else if (!h->advised)
		nxd_info("model: the weights are on 4 KiB pages (NX_HUGE=0)");
	else if (huge < 0)
		nxd_info("model: /proc/self/smaps unreadable: cannot tell whether the weights are on 2 MiB pages");
	else if (huge == 0)
		nxd_info("model: the kernel gave the weights 4 KiB pages, no 2 MiB ones "
			 "(/sys/kernel/mm/transparent_hugepage/enabled); decode is slower");
	else
		nxd_info("model: %.1f of %.1f MiB of weights on 2 MiB pages", (double)huge / 1048576, mib);
}

static void pick_type(struct nxd_model *mo)
{
	uint64_t bytes[NX_TYPE_COUNT] = { 0 };
	for (uint64_t i = 0; i < mo->g.n_tensors; i++) {
		const struct gguf_tensor *t = &mo->g.tensors[i];
		if (t->n_dims >= 2 && (unsigned)t->type < NX_TYPE_COUNT)
			bytes[t->type] += t->size;
	}
	int best = 0;
	for (int t = 1; t < NX_TYPE_COUNT; t++)
		if (bytes[t] > bytes[best])
			best = t;
	snprintf(mo->type, sizeof(mo->type), "%s", nx_type_name((uint32_t)best));
	for (char *p = mo->type; *p; p++)
		*p = (char)toupper((unsigned char)*p);
}

/* The tile state asked of Linux before any kernel is chosen, the fork and the
 * seccomp filter (kern/cpu.h), and the AMX kernels checked against the
 * AVX-512 ones (kern/pack.h); once, for the model and not its draft. */
static void kern_amx_at_start(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	const uint32_t need = NX_CPU_AMX_TILE | NX_CPU_AMX_INT8;
	const bool has = (nx_cpu_features() & need) == need, got = nx_cpu_amx_request();
	struct nx_err err = {{0}};
	if (nx_pack_kernel_amx(NX_Q8_0) && nx_pack_amx_check(&err) < 0)
		nxd_err("kernels: %s", err.msg);
	else if (has && !got)
		nxd_warn("kernels: the CPU has AMX-INT8 but Linux refused the tile state (arch_prctl "
			 "ARCH_REQ_XCOMP_PERM): steps run the AVX-512 kernels");
	else if (has)
		nxd_info("kernels: AMX-INT8 tiles for steps of many tokens%s",
			 nx_kern_set(NX_KFAM_PACK) == NX_KSET_AMX ? "" : " not used (NX_KERN below amx)");
}

/* The file at path into mo: read (or mapped), parsed, bound, packed and
 * made read-only. The model and the draft model (draft.c) both come this
 * way, so every rule of the loader applies to both. */
int nxd_model_load_weights(struct nxd *d, struct nxd_model *mo, const char *path, struct nx_err *err)
{
	size_t size = 0;
	void *plain = NULL; /* copy mode: the file mapped, for nx_model_repack_inplace */
	struct nx_err kerr = {{0}};
	if (nx_kern_env_check(&kerr) < 0)
		nxd_warn("%s", kerr.msg);
	kern_amx_at_start();
	int fd = open_model(path, &size, err);
	if (fd < 0)
		return -1;
	/* Before a byte is read: a model that cannot fit is refused here, not
	 * OOM-killed halfway through the read. */
	if (nxd_mem_check_model(d, size, err) < 0) {
		close(fd);
		return -1;
	}
	double t0 = nxd_now();
	if (d->o.use_mmap) {
		/* Read-only and shared: every worker maps the same page cache pages. */
		void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			nx_errf(err, "model: mmap(%s, %zu bytes) failed: %s", path, size, strerror(errno));
			close(fd);
			return -1;
		}
		mo->map = p;
		mo->bytes = p;
	} else {
		/* Private memory, not the arena: shared memory gets no huge pages
		 * unless sysfs says so (shm/hugemem.h). NX_HUGE=0: 4 KiB pages. */
		if (nx_huge_map(&mo->copy, size, nx_env()->huge, err) < 0) {
			close(fd);
			return nx_err_prefix(err, "model: no memory for %s", path);
		}
		if (uring_read_all(fd, mo->copy.p, size, path, err) < 0) {
			close(fd);
			return -1;
		}
		mo->bytes = mo->copy.p;
		/* The plain rows of the matrices packed below stay readable (the
		 * embedding lookup, a LoRA fold) through a read-only mapping of the
		 * file: page cache, paged in only where read. NX_PACK=0: no packing. */
		if (nx_env()->pack) {
			plain = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
			if (plain == MAP_FAILED) {
				nxd_warn("model: mmap(%s) failed: %s; the plain kernels will be used", path, strerror(errno));
				plain = NULL;
			}
			mo->map = plain; /* unmapped by nxd_model_free */
		}
	}
	close(fd);
	mo->size = size;
	nxd_info("model: %s: %zu bytes %s in %.0f ms", path, size,
		 d->o.use_mmap ? "mapped (MAP_SHARED, read-only)" : "read into private memory (io_uring)",
		 (nxd_now() - t0) * 1e3);

	/* Parse and bind the bytes the workers will use, not a second view of
	 * the file: what is validated is exactly what is computed on. */
	if (gguf_parse(&mo->g, mo->bytes, mo->size, err) < 0)
		return nx_err_prefix(err, "model %s", path);
	if (nx_model_bind(&mo->m, &mo->g, err) < 0)
		return nx_err_prefix(err, "model %s", path);
	if (plain) {
		/* Tile-kernel layout (kern/pack.h), in place in the arena: no memory added. */
		double t1 = nxd_now();
		int k = nx_model_repack_inplace(&mo->m, (const uint8_t *)plain - mo->bytes, err);
		if (k < 0)
			return nx_err_prefix(err, "model %s", path);
		nxd_info("model: %d matrices packed for the tile kernels in %.0f ms", k, (nxd_now() - t1) * 1e3);
	}
	if (mo->copy.p) {
		/* Nothing writes the weights from here on, and nothing may: after
		 * fork a write by the supervisor would copy the page for it alone,
		 * and the workers would go on computing with the old bytes.
		 * Read-only, such a write faults instead. (A LoRA fold writes new
		 * arena blocks and swaps pointers: daemon/lora_fold.c.) */
		if (mprotect(mo->copy.p, mo->copy.len, PROT_READ) < 0)
			return nx_errf(err, "model: mprotect(%zu bytes, PROT_READ) failed: %s", mo->copy.len,
				       strerror(errno));
		log_pages(&mo->copy);
	}
	return 0;
}

int nxd_model_load(struct nxd *d, struct nx_err *err)
{
	struct nxd_model *mo = &d->model;
	const char *path = d->o.model_path;
	if (nxd_model_load_weights(d, mo, path, err) < 0)
		return -1;
	if (nx_tok_load(&mo->tok, &mo->g, err) < 0)
		return nx_err_prefix(err, "model %s: tokenizer", path);
	mo->n_vocab = mo->m.hp.n_vocab;
	if (nx_tok_n_vocab(mo->tok) > mo->n_vocab)
		return nx_errf(err, "model %s: tokenizer has %d tokens, the output layer only %d", path,
			       (int)nx_tok_n_vocab(mo->tok), mo->n_vocab);
	double t_trie = nxd_now();
	if (nx_vocab_trie_build(mo->tok, mo->n_vocab, &mo->trie, err) < 0)
		return nx_err_prefix(err, "model %s", path);
	nxd_debug("model: token trie for constrained decoding in %.0f ms", (nxd_now() - t_trie) * 1e3);
	if (gguf_get_str(&mo->g, "general.name", &mo->name, false, err) < 0)
		mo->name = NULL;
	if (!mo->name) {
		const char *b = strrchr(path, '/');
		mo->name = strdup(b ? b + 1 : path);
		if (!mo->name)
			return nx_errf(err, "model: out of memory");
	}
	if (gguf_get_str(&mo->g, "tokenizer.chat_template", &mo->jinja, false, err) < 0)
		mo->jinja = NULL;
	mo->tmpl = nx_chat_detect(mo->jinja);
	if (d->o.chat_template_file) {
		char *src;
		if (nx_chat_template_file(d->o.chat_template_file, &src, &mo->tmpl, err) < 0)
			return nx_err_prefix(err, "--chat-template");
		free(mo->jinja);
		mo->jinja = src; /* its default system prompt and dates are the file's */
	} else if (d->o.chat_template)
		nx_chat_tmpl_parse(d->o.chat_template, &mo->tmpl, NULL); /* checked by parse_args */
	else if (mo->tmpl == NX_CHAT_UNKNOWN)
		nxd_warn("model: tokenizer.chat_template is not one nxd can render (%s): chat requests (messages, a "
			 "prompt without \"raw\") are refused; start nxd with --chat-template NAME", nx_chat_tmpl_names());
	mo->arch = nx_arch_name(mo->m.hp.arch);
	pick_type(mo);
	nxd_info("model: %s (%s, %s), %d layers, dim %d, vocab %d, context %d, chat template %s%s", mo->name,
		 mo->arch, mo->type, mo->m.hp.n_layer, mo->m.hp.dim, mo->n_vocab, mo->m.hp.n_ctx_train,
		 nx_chat_tmpl_name(mo->tmpl),
		 d->o.chat_template_file ? " (--chat-template FILE)" : d->o.chat_template ? " (--chat-template)"
		 : !mo->jinja ? " (none in the file)" : "");
	return 0;
}

void nxd_model_free(struct nxd *d)
{
	nxd_model_free_one(&d->model);
	nxd_model_free_one(&d->draft);
}

void nxd_model_free_one(struct nxd_model *mo)
{
	nx_vocab_trie_free(mo->trie);
	mo->trie = NULL;
	if (mo->tok)
		nx_tok_free(mo->tok);
	gguf_free(&mo->g);
	free(mo->name);
	free(mo->jinja);
	if (mo->map)
		munmap(mo->map, mo->size);
	nx_huge_unmap(&mo->copy);
	memset(mo, 0, sizeof(*mo));
}
