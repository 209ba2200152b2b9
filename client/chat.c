/* chat.c - nxctl chat: one conversation on one connection, slash commands, multi-line messages, a context that never fills up. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/nxctl.h"
#include "proto/proto.h"

#define CHAT_COMMANDS                                                                              \
	"  /help               these commands\n"                                                  \
	"  /bye, /exit, /quit  leave (so does Ctrl-D on an empty line)\n"                        \
	"  /reset, /clear      forget the conversation (the system message stays)\n"            \
	"  /system [TEXT]      show the system message, or set it to TEXT\n"                    \
	"  /set [NAME VALUE]   show the sampling options, or set one: temperature, top_k,\n"    \
	"                      top_p, min_p, repeat_penalty, repeat_last_n, seed, max_tokens,\n" \
	"                      speculate (MODE[:K], as --speculate) (VALUE 'default': nxd's own)\n" \
	"  /lora [NAME[:SCALE]...|off]  show, set or clear the adapters of the next answers\n"  \
	"  /stats              the last answer: tokens/s, prompt and cached tokens, seed, drafts\n" \
	"A message of several lines: begin it with \"\"\" and end it with \"\"\", or end each\n"  \
	"line but the last with a backslash. A message that begins with '/' goes in a \"\"\" block.\n"

const char nxc_usage_chat[] =
	"usage: nxctl chat [--system TEXT] [OPTIONS]\n\n"
	"An interactive conversation: each message read from stdin goes to the model with\n"
	"the conversation so far, and the answer streams back. On a terminal, lines are\n"
	"edited with libedit (arrows, Ctrl-R search, ~/.editrc) and kept in\n"
	"$XDG_STATE_HOME/nxctl/history (default ~/.local/state/nxctl/history).\n"
	"When the conversation outgrows the context, its oldest turns are dropped (the\n"
	"system message stays), with a note. Ctrl-C cancels the answer being written;\n"
	"at the prompt it drops the line. Ctrl-D or /bye leaves.\n\n"
	"commands:\n" CHAT_COMMANDS "\n" NXC_SAMPLING_HELP
	"      --system TEXT      system message at the start of the conversation\n";

struct chat {
	struct nxc_ctx *ctx;    /* to connect again when nxd restarted */
	struct nxc_conn c;
	struct nxc_line in;
	struct nxc_gen_args ga; /* ga.params: the sampling options, changed by /set and /lora */
	json_t *messages;       /* the conversation; [0] the system message when there is one */
	json_t *last_done;      /* the last answer's done event, for /stats */
	int n_ctx;              /* from hello: tells a full context from max_tokens */
	bool eof;               /* the input ended inside a multi-line message */
	/* What the conversation takes of the context, from the done events:
	 * prompt + answer tokens of the last turn, and each exchange's share
	 * (the first one's includes the system message), oldest first. */
	long used;
	long *sizes;            /* (n_sizes), one per exchange in messages */
	int n_sizes;
};

// --- the conversation

static bool has_system(const struct chat *ch)
{
	const char *role = json_string_value(json_object_get(json_array_get(ch->messages, 0), "role"));
	return role && !strcmp(role, "system");
}

static json_t *message(const char *role, json_t *content)
{
	return json_pack("{s:s, s:o}", "role", role, "content", content);
}

/* The oldest exchange (a user message and the answers up to the next user
 * message) goes; false when only the message being sent is left. */
static bool drop_oldest(struct chat *ch)
{
	size_t i = has_system(ch) ? 1 : 0, n = json_array_size(ch->messages), j;
	for (j = i + 1; j < n; j++)
		if (!strcmp(json_string_value(json_object_get(json_array_get(ch->messages, j), "role")), "user"))
			break;
	if (j >= n)
		return false;
	while (j-- > i)
		json_array_remove(ch->messages, i);
	if (ch->n_sizes > 0) {
		ch->used -= ch->sizes[0];
		memmove(ch->sizes, ch->sizes + 1, (size_t)--ch->n_sizes * sizeof(*ch->sizes));
	}
	return true;
}

static void forget_all(struct chat *ch)
{
	ch->used = 0;
	ch->n_sizes = 0;
}

/* The answer's room: max_tokens (nxd's default 256), at most half the context. */
static long answer_room(const struct chat *ch)
{
	json_t *mt = json_object_get(ch->ga.params, "max_tokens");
	long room = mt ? (long)json_integer_value(mt) : 256;
	return room < ch->n_ctx / 2 ? room : ch->n_ctx / 2;
}

/* Before a message is sent: the oldest exchanges go while the conversation,
 * the message (about 3 bytes a token) and room for the answer would not fit,
 * so that answers are not cut by a full context. nxd's context_overflow
 * remains the last word (turn). */
static int make_room(struct chat *ch, size_t text_len)
{
	int dropped = 0;
	while (ch->n_sizes > 0 && ch->used + (long)(text_len / 3) + 8 + answer_room(ch) > ch->n_ctx && drop_oldest(ch))
		dropped++;
	return dropped;
}

/* A turn that got its done: the new exchange's share of the context. */
static void measure(struct chat *ch, json_t *done)
{
	json_t *u = json_object_get(done, "usage");
	long now = (long)(json_integer_value(json_object_get(u, "prompt_tokens")) +
			  json_integer_value(json_object_get(u, "completion_tokens")));
	long *s = realloc(ch->sizes, (size_t)(ch->n_sizes + 1) * sizeof(*s));
	if (!s) {
		forget_all(ch); /* without sizes, only nxd's context_overflow trims */
		return;
	}
	ch->sizes = s;
	s[ch->n_sizes++] = now - ch->used;
	ch->used = now;
}

static bool is_code(json_t *ev, const char *code)
{
	const char *c = json_string_value(json_object_get(ev, "code"));
	return c && !strcmp(c, code);
}

static void note_dropped(const struct chat *ch, int dropped)
{
	if (dropped)
		nxc_note("(%d oldest turn%s dropped to fit the context of %d tokens)", dropped, dropped == 1 ? "" : "s",
			 ch->n_ctx);
}

static void after_answer(struct chat *ch, int rc, struct nxc_answer *ans)
{
	char note[160];
	if (rc == NXC_EXIT_OK && nxc_cut_note(ans->done, ch->n_ctx, note, sizeof(note)))
		nxc_note("%s", note);
	if (ans->done) {
		json_decref(ch->last_done);
		ch->last_done = json_incref(ans->done);
	}
}

/* A new connection after nxd went away (restarted, say): the conversation
 * is nxctl's, so it goes on there. */
static int reconnect(struct chat *ch)
{
	nxc_close(&ch->c);
	json_t *hello = NULL;
	int rc = nxc_open(ch->ctx, &ch->c, &hello);
	if (rc)
		return rc;
	ch->n_ctx = (int)json_integer_value(json_object_get(hello, "n_ctx"));
	json_decref(hello);
	if (ch->in.tty)
		nxc_note("(connected to nxd again)");
	return 0;
}

/* Sends req and streams the answer; a prompt over the context loses the
 * oldest turns until it fits (*dropped counts them). A connection found
 * broken before anything came back is made again, once. */
static int send_turn(struct chat *ch, struct nxc_answer *ans, int *dropped)
{
	bool retried = false;
	for (;;) {
		if (nxc_peer_gone(&ch->c)) {
			int rc = reconnect(ch);
			if (rc)
				return rc;
		}
		json_t *req = json_deep_copy(ch->ga.params);
		json_object_set(req, "messages", ch->messages);
		ans->keep_error = true;
		int rc = nxc_stream_answer(&ch->c, req, false, ans);
		if (rc != NXC_EXIT_OK && ch->c.broken && !retried && !ans->done && !ans->error && !ans->text.len) {
			retried = true; /* the daemon was gone before this turn: try the new one */
			nxc_answer_free(ans);
			continue;
		}
		if (!(ans->error && is_code(ans->error, "context_overflow") && drop_oldest(ch)))
			return rc;
		++*dropped;
		nxc_answer_free(ans);
	}
}

/* Sends the conversation with text as the next user message. One that
 * cannot fit even alone leaves the conversation as it was. */
static int turn(struct chat *ch, const char *text)
{
	json_t *content = json_string(text);
	if (!content) {
		nxc_msg("that message is not valid UTF-8; not sent");
		return NXC_EXIT_OK;
	}
	json_t *before = json_copy(ch->messages);
	json_array_append_new(ch->messages, message("user", content));
	int dropped = make_room(ch, strlen(text));
	struct nxc_answer ans = {0};
	int rc = send_turn(ch, &ans, &dropped);
	if (rc == NXC_EXIT_OK || (rc == NXC_EXIT_INTR && !ans.hard)) {
		/* what was said stays, even a cancelled partial answer; only now
		 * are the turns dropped for it gone (an answer refused gets them back) */
		json_array_append_new(ch->messages, message("assistant", json_string(ans.text.p ? ans.text.p : "")));
		note_dropped(ch, dropped);
		if (ans.done)
			measure(ch, ans.done);
	} else if (ans.error && is_code(ans.error, "context_overflow")) {
		json_decref(ch->messages); /* too long alone: nothing dropped for it */
		ch->messages = json_incref(before);
		forget_all(ch);
	} else {
		json_array_remove(ch->messages, json_array_size(ch->messages) - 1);
		note_dropped(ch, dropped); /* they are gone all the same */
	}
	if (ans.error)
		nxc_print_error(ans.error);
	after_answer(ch, rc, &ans);
	json_decref(before);
	nxc_answer_free(&ans);
	return rc;
}

// --- commands

static void cmd_system(struct chat *ch, const char *arg)
{
	if (!*arg) {
		if (has_system(ch))
			nxc_printf("%s\n", json_string_value(json_object_get(json_array_get(ch->messages, 0), "content")));
		else
			nxc_printf("(no system message)\n");
		return;
	}
	json_t *s = json_string(arg);
	if (!s) {
		nxc_msg("/system: the text is not valid UTF-8");
		return;
	}
	if (has_system(ch))
		json_array_set_new(ch->messages, 0, message("system", s));
	else
		json_array_insert_new(ch->messages, 0, message("system", s));
	if (ch->in.tty)
		nxc_note("(system message set)");
}

static void cmd_reset(struct chat *ch)
{
	json_t *sys = has_system(ch) ? json_incref(json_array_get(ch->messages, 0)) : NULL;
	json_array_clear(ch->messages);
	forget_all(ch);
	if (sys)
		json_array_append_new(ch->messages, sys);
	if (ch->in.tty)
		nxc_note("(conversation cleared)");
}

/* The sampling options /set knows: the request field, its range (as nxd
 * checks it, so a bad value is refused here, not on every later turn). */
static const struct set_opt {
	const char *key, *alias;
	bool real;
	double lo, hi;
	bool lo_open;
	const char *dflt, *range;
} set_opts[] = {
	{"temperature", "temp", true, 0, HUGE_VAL, false, "0.8", "a number >= 0 (0 is greedy)"},
	{"top_k", NULL, false, 0, INT32_MAX, false, "40", "an integer >= 0 (0 is off)"},
	{"top_p", NULL, true, 0, 1, true, "0.95", "a number in (0, 1]"},
	{"min_p", NULL, true, 0, 1, false, "0.05", "a number in [0, 1]"},
	{"repeat_penalty", NULL, true, 0, HUGE_VAL, true, "1.0", "a number > 0 (1 is off)"},
	{"repeat_last_n", NULL, false, 0, INT32_MAX, false, "64", "an integer >= 0"},
	{"seed", NULL, false, 0, (double)INT64_MAX, false, "a fresh one per answer", "an integer in 0..2^63-1"},
	{"max_tokens", "num_predict", false, 1, (double)INT64_MAX, false, "256",
	 "an integer >= 1 (more than nxd allows is its limit)"},
};

static const struct set_opt *find_opt(char *name)
{
	for (char *p = name; *p; p++)
		if (*p == '-')
			*p = '_'; /* top-k as the flag spells it */
	for (size_t i = 0; i < sizeof(set_opts) / sizeof(set_opts[0]); i++)
		if (!strcmp(name, set_opts[i].key) || (set_opts[i].alias && !strcmp(name, set_opts[i].alias)))
			return &set_opts[i];
	return NULL;
}

static void show_opts(struct chat *ch)
{
	for (size_t i = 0; i < sizeof(set_opts) / sizeof(set_opts[0]); i++) {
		json_t *v = json_object_get(ch->ga.params, set_opts[i].key);
		if (json_is_integer(v))
			nxc_printf("  %-15s %lld\n", set_opts[i].key, (long long)json_integer_value(v));
		else if (json_is_real(v))
			nxc_printf("  %-15s %g\n", set_opts[i].key, json_real_value(v));
		else
			nxc_printf("  %-15s %s (nxd's default)\n", set_opts[i].key, set_opts[i].dflt);
	}
	json_t *sp = json_object_get(ch->ga.params, "speculate"), *k = json_object_get(sp, "k");
	nxc_printf("  %-15s %s", "speculate", sp ? json_string_value(json_object_get(sp, "mode")) : "nxd's --speculate");
	if (k)
		nxc_printf(":%lld", (long long)json_integer_value(k));
	nxc_printf("\n");
}

/* /set speculate MODE[:K]: not a number like the others (set_opts). */
static void set_speculate(struct chat *ch, const char *val)
{
	const bool dflt = !strcmp(val, "default");
	json_t *sp = dflt ? NULL : nxc_spec_value(val);
	if (!dflt && !sp) {
		nxc_msg("/set speculate wants %s, got '%s'", NXC_SPEC_RANGE, val);
		return;
	}
	if (sp)
		json_object_set_new(ch->ga.params, "speculate", sp);
	else
		json_object_del(ch->ga.params, "speculate");
	if (ch->in.tty)
		nxc_note("(speculate: %s)", sp ? val : "nxd's --speculate");
}

static json_t *opt_value(const struct set_opt *o, const char *val)
{
	char *end;
	errno = 0;
	if (o->real) {
		double d = strtod(val, &end);
		if (!*val || *end || errno || !isfinite(d) || d < o->lo || d > o->hi || (o->lo_open && d == o->lo))
			return NULL;
		return json_real(d);
	}
	long long v = strtoll(val, &end, 10);
	if (!*val || *end || errno || (double)v < o->lo || (double)v > o->hi)
		return NULL;
	return json_integer(v);
}

static void cmd_set(struct chat *ch, char *arg)
{
	char *save = NULL, *name = strtok_r(arg, " \t", &save), *val = strtok_r(NULL, " \t", &save);
	if (!name) {
		show_opts(ch);
		return;
	}
	const bool spec = !strcmp(name, "speculate");
	const struct set_opt *o = spec ? NULL : find_opt(name);
	if ((!o && !spec) || !val || strtok_r(NULL, " \t", &save)) {
		nxc_msg(o || spec ? "/set %s wants one VALUE" : "/set: unknown option '%s' (/set lists them)", name);
		return;
	}
	if (spec) {
		set_speculate(ch, val);
		return;
	}
	if (!strcmp(val, "default")) {
		json_object_del(ch->ga.params, o->key);
	} else {
		json_t *v = opt_value(o, val);
		if (!v) {
			nxc_msg("/set %s wants %s, got '%s'", o->key, o->range, val);
			return;
		}
		json_object_set_new(ch->ga.params, o->key, v);
	}
	if (ch->in.tty)
		nxc_note("(%s: %s)", o->key, strcmp(val, "default") ? val : o->dflt);
}

static void cmd_lora(struct chat *ch, char *arg)
{
	json_t *list = json_object_get(ch->ga.params, "lora");
	if (!*arg) {
		if (!json_array_size(list))
			nxc_printf("(no adapter)\n");
		for (size_t i = 0; i < json_array_size(list); i++) {
			json_t *a = json_array_get(list, i), *sc = json_object_get(a, "scale");
			nxc_printf("%s", json_string_value(json_object_get(a, "name")));
			if (sc)
				nxc_printf(":%g", json_number_value(sc));
			nxc_printf("\n");
		}
		return;
	}
	json_t *fresh = json_array();
	char *save = NULL;
	for (char *w = strtok_r(arg, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
		if (!strcmp(w, "off") || !strcmp(w, "none"))
			continue;
		char *colon = strrchr(w, ':'), *end;
		json_t *a = json_object();
		if (colon) {
			*colon = '\0';
			errno = 0;
			double sc = strtod(colon + 1, &end);
			if (!colon[1] || *end || errno || !isfinite(sc)) {
				nxc_msg("/lora: '%s' is not a scale", colon + 1);
				json_decref(a);
				json_decref(fresh);
				return;
			}
			json_object_set_new(a, "scale", json_real(sc));
		}
		json_t *name = json_string(w);
		if (!name || !*w) {
			json_decref(name);
			json_decref(a);
			json_decref(fresh);
			nxc_msg("/lora wants NAME or NAME:SCALE");
			return;
		}
		json_object_set_new(a, "name", name);
		json_array_append_new(fresh, a);
	}
	if (json_array_size(fresh))
		json_object_set_new(ch->ga.params, "lora", fresh);
	else {
		json_decref(fresh);
		json_object_del(ch->ga.params, "lora");
	}
	if (ch->in.tty)
		nxc_note(json_object_get(ch->ga.params, "lora") ? "(adapter set for the next answers)" : "(no adapter)");
}

static double num(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static void cmd_stats(struct chat *ch)
{
	json_t *d = ch->last_done, *u = json_object_get(d, "usage"), *t = json_object_get(d, "timing");
	if (!d) {
		nxc_printf("(no answer yet)\n");
		return;
	}
	nxc_printf("answer:  %lld tokens in %.2f s, %.1f tokens/s (%s)\n", (long long)num(u, "completion_tokens"),
		   num(t, "decode_ms") / 1e3, num(t, "tokens_per_s"), json_string_value(json_object_get(d, "reason")));
	nxc_printf("prompt:  %lld tokens, %lld of them from the prompt cache, %.2f s to the first token\n",
		   (long long)num(u, "prompt_tokens"), (long long)num(u, "cached_tokens"), num(t, "prefill_ms") / 1e3);
	if (json_is_integer(json_object_get(d, "seed")))
		nxc_printf("seed:    %lld (/set seed %lld gives this answer again)\n",
			   (long long)json_integer_value(json_object_get(d, "seed")),
			   (long long)json_integer_value(json_object_get(d, "seed")));
	json_t *sp = json_object_get(d, "speculate");
	if (sp) {
		const long long acc = num(sp, "accepted"), n = num(u, "completion_tokens");
		nxc_printf("drafts:  %lld of %lld accepted (%s)", acc, (long long)num(sp, "drafted"),
			   json_string_value(json_object_get(sp, "mode")));
		if (n > 1 && n - 1 > acc) /* the first token is the prompt's step */
			nxc_printf(", %.2f tokens a step", (double)(n - 1) / (double)(n - 1 - acc));
		nxc_printf("\n");
	}
}

enum { CMD_DONE, CMD_BYE };

static int run_command(struct chat *ch, char *line)
{
	char *arg = line + strcspn(line, " \t");
	if (*arg)
		*arg++ = '\0';
	arg += strspn(arg, " \t");
	const char *c = line + 1;
	if (!strcmp(c, "bye") || !strcmp(c, "exit") || !strcmp(c, "quit"))
		return CMD_BYE;
	if (!strcmp(c, "help") || !strcmp(c, "?"))
		nxc_printf("%s", CHAT_COMMANDS);
	else if (!strcmp(c, "reset") || !strcmp(c, "clear"))
		cmd_reset(ch);
	else if (!strcmp(c, "system"))
		cmd_system(ch, arg);
	else if (!strcmp(c, "set"))
		cmd_set(ch, arg);
	else if (!strcmp(c, "lora"))
		cmd_lora(ch, arg);
	else if (!strcmp(c, "stats"))
		cmd_stats(ch);
	else
		nxc_msg("unknown command '/%s' (/help lists them; a message beginning with '/' goes in a \"\"\" block)", c);
	return CMD_DONE;
}

// --- reading a message

static bool ends_with(const char *s, size_t n, const char *tail)
{
	size_t k = strlen(tail);
	return n >= k && !memcmp(s + n - k, tail, k);
}

/* The lines after a first one that opened a """ block or ended in '\'. */
static int continuation(struct chat *ch, struct nxc_text *msg, bool block)
{
	bool first = block && msg->len == 0; /* a """ of its own opened the block: its line adds no newline */
	for (;;) {
		char *line;
		size_t len;
		int k = nxc_line_read(&ch->in, "... ", &line, &len);
		if (k == 0) { /* end of input: what was typed is sent */
			ch->eof = true;
			return 1;
		}
		if (k < 0)
			return k;
		if (block && len == 3 && !strcmp(line, "\"\"\""))
			return 1; /* a closing line of its own adds no newline */
		if (!first)
			nxc_text_add(msg, "\n", 1);
		first = false;
		if (block && ends_with(line, len, "\"\"\"")) {
			nxc_text_add(msg, line, len - 3);
			return 1;
		}
		if (!block && ends_with(line, len, "\\")) {
			nxc_text_add(msg, line, len - 1);
			continue;
		}
		nxc_text_add(msg, line, len);
		if (!block)
			return 1;
	}
}

/* One message into msg: 1, 2 for a /command, 0 at the end of input, -2
 * after a Ctrl-C (the message is dropped), -1 on error. */
static int read_message(struct chat *ch, struct nxc_text *msg)
{
	char *line;
	size_t len;
	int k;
	if (ch->eof)
		return 0;
	do
		k = nxc_line_read(&ch->in, "> ", &line, &len);
	while (k == 1 && len == 0);
	if (k != 1)
		return k;
	if (line[0] == '/') {
		nxc_text_add(msg, line, len);
		return 2;
	}
	if (!strncmp(line, "\"\"\"", 3)) {
		if (len >= 6 && ends_with(line, len, "\"\"\"")) { /* """one line""" */
			nxc_text_add(msg, line + 3, len - 6);
			return 1;
		}
		nxc_text_add(msg, line + 3, len - 3);
		return continuation(ch, msg, true);
	}
	if (ends_with(line, len, "\\")) {
		nxc_text_add(msg, line, len - 1);
		return continuation(ch, msg, false);
	}
	nxc_text_add(msg, line, len);
	return 1;
}

// --- the session

static int chat_open(struct nxc_ctx *ctx, struct chat *ch)
{
	json_t *hello = NULL;
	ch->ctx = ctx;
	int rc = nxc_open(ctx, &ch->c, &hello);
	if (rc)
		return rc;
	ch->n_ctx = (int)json_integer_value(json_object_get(hello, "n_ctx"));
	json_decref(hello);
	nxc_line_open(&ch->in);
	ch->messages = json_array();
	return 0;
}

static int chat_loop(struct chat *ch)
{
	for (;;) {
		struct nxc_text msg = {0};
		int k = read_message(ch, &msg), rc = NXC_EXIT_OK;
		if (k == 2 && run_command(ch, msg.p) == CMD_BYE)
			k = 0;
		else if (k == 2)
			k = 3;
		else if (k == 1)
			rc = turn(ch, msg.p ? msg.p : "");
		free(msg.p);
		if (k == 0) {
			if (ch->in.tty)
				putchar('\n');
			return NXC_EXIT_OK;
		}
		if (k == -2 && ch->in.el) { /* Ctrl-C at the prompt: the line goes, the chat stays */
			nxc_interrupts = 0;
			nxc_note("(Ctrl-D or /bye leaves)");
			continue;
		}
		if (k == -2)
			return NXC_EXIT_INTR;
		if (k < 0) {
			nxc_msg("cannot read stdin: %s", strerror(errno));
			return NXC_EXIT_ERROR;
		}
		if (rc == NXC_EXIT_INTR) {
			if (nxc_interrupts >= 2)
				return NXC_EXIT_INTR; /* a second Ctrl-C leaves */
			nxc_note("(cancelled)");
		}
		nxc_interrupts = 0;
		if (ch->c.broken && !ch->in.tty) /* the daemon went away: a script stops there */
			return NXC_EXIT_ERROR;
		if (ch->c.broken) /* a person may start it again: the next message connects anew */
			nxc_note("(the connection to nxd broke; the next message connects again)");
	}
}

int nxc_cmd_chat(struct nxc_ctx *ctx, int argc, char **argv)
{
	struct chat ch;
	memset(&ch, 0, sizeof(ch));
	int rc = nxc_gen_parse("chat", true, argc, argv, &ch.ga);
	if (rc) {
		json_decref(ch.ga.params);
		return rc == 1 ? NXC_EXIT_OK : NXC_EXIT_USAGE;
	}
	if (ch.ga.first_arg < argc) {
		json_decref(ch.ga.params);
		return nxc_usage_err("chat", "unexpected argument '%s' (chat reads stdin)", argv[ch.ga.first_arg]);
	}
	json_t *system = NULL;
	if (ch.ga.system && !(system = json_string(ch.ga.system))) {
		json_decref(ch.ga.params);
		return nxc_usage_err("chat", "--system is not valid UTF-8");
	}
	json_object_set_new(ch.ga.params, "op", json_string("generate"));
	json_object_set_new(ch.ga.params, "stream", json_true());
	nxc_signals_init();
	rc = chat_open(ctx, &ch);
	if (rc == 0) {
		if (system)
			json_array_append_new(ch.messages, message("system", json_incref(system)));
		rc = chat_loop(&ch);
		nxc_line_close(&ch.in);
		nxc_close(&ch.c);
	}
	json_decref(system);
	json_decref(ch.messages);
	json_decref(ch.last_done);
	json_decref(ch.ga.params);
	free(ch.sizes);
	return rc;
}
