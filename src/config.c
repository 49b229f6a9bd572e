/*
 * config: YAML files -> struct sl_config.
 *
 * Owns the config keys of DESIGN.md §3.  One static table, keys[], names every key with its type,
 * its place in struct sl_config, its default, and its range or allowed values; defaults, file
 * parsing, `--set` overrides, validation, the printed table, the YAML writer and the diff all walk
 * that table, so a new key is one line here plus its field in config.h.
 *
 * Files are read with libyaml's document API because its nodes carry the line and column every
 * error must name.  `include:` files are merged before the file that names them (which wins), and
 * `--set` values are parsed as YAML too, so a value means the same on the command line as in a
 * file.
 * Errors go to one stream (stderr unless the caller passes another); loading keeps going after a
 * bad key so one run reports every bad key of a file, and stops at a file that cannot be read.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* enum fields are stored through an int pointer */
_Static_assert(sizeof(enum sl_task) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sl_precision) == sizeof(int), "enum size");

enum key_type { K_STR, K_INT, K_LONG, K_DBL, K_BOOL, K_ENUM, K_PAIR };

struct enum_val {
	const char *name;
	int val;
};

struct key_def {
	const char *key;		/* "train.batch"; top-level keys have no dot */
	enum key_type type;
	size_t off;			/* in struct sl_config */
	size_t size;			/* of the field (strings: buffer size) */
	const char *def;		/* default, as YAML text */
	double lo, hi;			/* numbers (each element of a pair): allowed range */
	bool lo_open, hi_open;		/* lo < x instead of lo <= x; x < hi instead of x <= hi */
	const struct enum_val *vals;	/* K_ENUM: allowed names, NULL-terminated */
	bool required;			/* for a training run */
};

static const struct enum_val task_vals[] = {
	{ "classify", SL_TASK_CLASSIFY }, { "sft", SL_TASK_SFT }, { NULL, 0 } };
static const struct enum_val backend_vals[] = {
	{ "cuda", SL_BACKEND_CUDA }, { "cpu", SL_BACKEND_CPU }, { NULL, 0 } };
static const struct enum_val sched_vals[] = {
	{ "constant", SL_SCHED_CONSTANT }, { "linear", SL_SCHED_LINEAR },
	{ "cosine", SL_SCHED_COSINE }, { NULL, 0 } };
static const struct enum_val on_error_vals[] = {
	{ "fail", SL_ON_ERROR_FAIL }, { "skip", SL_ON_ERROR_SKIP }, { NULL, 0 } };
static const struct enum_val prec_vals[] = {
	{ "auto", SL_PREC_AUTO }, { "fp32", SL_PREC_FP32 }, { "bf16", SL_PREC_BF16 }, { NULL, 0 } };
/* master weights must stay fp32: AdamW's small updates vanish in bf16 */
static const struct enum_val master_vals[] = { { "fp32", SL_PREC_FP32 }, { NULL, 0 } };
static const struct enum_val reduce_vals[] = {
	{ "fp32", SL_PREC_FP32 }, { "bf16", SL_PREC_BF16 }, { NULL, 0 } };
static const struct enum_val export_vals[] = {
	{ "bf16", SL_PREC_BF16 }, { "fp32", SL_PREC_FP32 }, { NULL, 0 } };
static const struct enum_val shard_vals[] = {
	{ "world", SL_SHARD_WORLD }, { "node", SL_SHARD_NODE }, { NULL, 0 } };
static const struct enum_val offload_vals[] = {
	{ "none", SL_OFFLOAD_NONE }, { "optimizer", SL_OFFLOAD_OPTIMIZER },
	{ "params", SL_OFFLOAD_PARAMS }, { NULL, 0 } };

#define FIELD(f) offsetof(struct sl_config, f), sizeof(((struct sl_config *)0)->f)
#define ANY -HUGE_VAL, HUGE_VAL, false, false
#define GE(x) (x), HUGE_VAL, false, false		/* x <= v */
#define GT(x) (x), HUGE_VAL, true, false		/* x < v */
#define STR(k, f, d) { k, K_STR, FIELD(f), d, ANY, NULL, false }
#define REQ(k, f) { k, K_STR, FIELD(f), "", ANY, NULL, true }
#define INT(k, f, d, range) { k, K_INT, FIELD(f), d, range, NULL, false }
#define DBL(k, f, d, range) { k, K_DBL, FIELD(f), d, range, NULL, false }
#define BOOL(k, f, d) { k, K_BOOL, FIELD(f), d, ANY, NULL, false }
#define ENUM(k, f, d, v) { k, K_ENUM, FIELD(f), d, ANY, v, false }

/* Order is the order of the printed table and of the written YAML. */
static const struct key_def keys[] = {
	REQ("model.path", model.path),
	STR("model.revision", model.revision, "\"\""),
	ENUM("task", task, "classify", task_vals),
	REQ("data.train", data.train),
	STR("data.valid", data.valid, "\"\""),
	STR("data.text_field", data.text_field, "text"),
	STR("data.label_field", data.label_field, "label"),
	INT("data.max_state", data.max_state, "2048", GE(1)),
	BOOL("data.length_sort", data.length_sort, "true"),
	BOOL("data.shuffle", data.shuffle, "true"),
	{ "data.seed", K_LONG, FIELD(data.seed), "0", ANY, NULL, false },
	BOOL("data.pack", data.pack, "false"),
	ENUM("data.on_error", data.on_error, "fail", on_error_vals),
	BOOL("data.keep_reasoning", data.keep_reasoning, "false"),
	INT("train.batch", train.batch, "1", GE(1)),
	INT("train.accum", train.accum, "2", GE(1)),
	INT("train.steps", train.steps, "100", GE(0)),
	INT("train.epochs", train.epochs, "0", GE(0)),
	BOOL("train.activation_checkpointing", train.activation_checkpointing, "false"),
	INT("train.eval_every", train.eval_every, "50", GE(0)),
	INT("train.max_bad_steps", train.max_bad_steps, "3", GE(0)),
	BOOL("train.deterministic", train.deterministic, "false"),
	DBL("optim.lr", optim.lr, "1e-5", GT(0)),
	ENUM("optim.schedule", optim.schedule, "cosine", sched_vals),
	INT("optim.warmup", optim.warmup, "10", GE(0)),
	DBL("optim.min_lr", optim.min_lr, "0", GE(0)),
	{ "optim.betas", K_PAIR, FIELD(optim.betas), "[0.9, 0.95]", 0, 1, false, true, NULL,
	  false },
	DBL("optim.eps", optim.eps, "1e-8", GT(0)),
	DBL("optim.weight_decay", optim.weight_decay, "0.1", GE(0)),
	DBL("optim.clip", optim.clip, "1.0", GE(0)),
	DBL("optim.head_lr_mult", optim.head_lr_mult, "1.0", GE(0)),
	ENUM("backend", backend, "cuda", backend_vals),
	ENUM("precision.compute", precision.compute, "auto", prec_vals),
	ENUM("precision.master", precision.master, "fp32", master_vals),
	ENUM("precision.reduce", precision.reduce, "fp32", reduce_vals),
	ENUM("parallel.shard_group", parallel.shard_group, "world", shard_vals),
	INT("parallel.node_size", parallel.node_size, "0", GE(0)),
	BOOL("parallel.reshard_after_forward", parallel.reshard_after_forward, "true"),
	INT("parallel.prefetch", parallel.prefetch, "1", GE(0)),
	INT("parallel.context", parallel.context, "1", GE(1)),
	INT("parallel.expert", parallel.expert, "1", GE(1)),
	DBL("parallel.capacity_factor", parallel.capacity_factor, "0", GE(0)),
	ENUM("parallel.offload", parallel.offload, "none", offload_vals),
	INT("parallel.timeout_s", parallel.timeout_s, "600", GE(1)),
	INT("checkpoint.every", checkpoint.every, "50", GE(0)),
	INT("checkpoint.keep", checkpoint.keep, "2", GE(1)),
	STR("checkpoint.dir", checkpoint.dir, "checkpoints"),
	BOOL("checkpoint.optimizer", checkpoint.optimizer, "true"),
	INT("checkpoint.term_grace_s", checkpoint.term_grace_s, "25", GE(0)),
	ENUM("export.dtype", export_.dtype, "bf16", export_vals),
	BOOL("export.final", export_.final, "true"),
	/* sl_config_load replaces this with runs/<config name> unless a file or --set names one */
	STR("run.dir", run.dir, "runs/default"),
	INT("run.log_every", run.log_every, "10", GE(1)),
	DBL("gpu_log.every_s", gpu_log.every_s, "15", GE(0)),
	STR("gpu_log.file", gpu_log.file, "logs/gpu-%j-%h.csv"),
};
#define NKEYS ((int)(sizeof(keys) / sizeof(keys[0])))

static const char *const sections[] = {
	"model", "data", "train", "optim", "precision", "parallel", "checkpoint", "export", "run",
	"gpu_log", NULL
};

/* Where a value came from: "FILE:LINE:COL", or just "FILE" / "--set k=v" when line is 0. */
struct loc {
	const char *file;
	int line, col;		/* 1-based */
};

struct incl {
	const char *shown;	/* the path as resolved, for messages */
	char *real;		/* realpath(), to recognize a cycle */
};

#define MAX_INCLUDE_DEPTH 32
#define MAX_ERRORS 20

struct load_ctx {
	struct sl_config *cfg;
	FILE *err;
	int nerr;
	struct loc set_at[NKEYS];	/* where each key was last set; file NULL = default */
	char **names;			/* owned copies of file names that locations point into */
	int nnames;
	struct incl stack[MAX_INCLUDE_DEPTH];
	int depth;
};

/* -------------------------------------------------------------------------------------------- */
/* errors */

static void __attribute__((format(printf, 4, 5)))
cfg_err(struct load_ctx *lc, const struct loc *at, const char *key, const char *fmt, ...)
{
	va_list ap;

	lc->nerr++;
	if (lc->nerr > MAX_ERRORS)
		return;
	if (at->line > 0)
		fprintf(lc->err, "%s:%d:%d: ", at->file, at->line, at->col);
	else
		fprintf(lc->err, "%s: ", at->file);
	if (key)
		fprintf(lc->err, "%s: ", key);
	va_start(ap, fmt);
	vfprintf(lc->err, fmt, ap);
	va_end(ap);
	fputc('\n', lc->err);
	if (lc->nerr == MAX_ERRORS)
		fprintf(lc->err, "%s: too many errors; stopping here\n", at->file);
}

/*
 * The position of @node in the file @base names.  A --set option (line -1) is its own location:
 * positions inside the option's text would mean nothing to the user.
 */
static struct loc node_loc(const struct loc *base, const yaml_node_t *node);

/*
 * libyaml resolves an alias (*name) to the anchored node itself, so a node with two parents is
 * an alias.  A config has no use for them, and refusing them keeps any walk of the document
 * linear in the file's size (no "billion laughs").
 */
static int refuse_aliases(struct load_ctx *lc, yaml_document_t *doc, const struct loc *file)
{
	size_t n = doc->nodes.top - doc->nodes.start;
	unsigned char *refs = calloc(n + 1, 1);
	int rc = 0;

	if (!refs)
		return -ENOMEM;
	for (yaml_node_t *nd = doc->nodes.start; nd < doc->nodes.top && !rc; nd++) {
		int kids[2], nk = 0;

		if (nd->type == YAML_SEQUENCE_NODE) {
			for (yaml_node_item_t *it = nd->data.sequence.items.start;
			     it < nd->data.sequence.items.top && !rc; it++)
				if (*it >= 1 && (size_t)*it <= n && refs[*it]++)
					rc = *it;
			continue;
		}
		if (nd->type != YAML_MAPPING_NODE)
			continue;
		for (yaml_node_pair_t *p = nd->data.mapping.pairs.start;
		     p < nd->data.mapping.pairs.top && !rc; p++) {
			kids[0] = p->key;
			kids[1] = p->value;
			for (nk = 0; nk < 2 && !rc; nk++)
				if (kids[nk] >= 1 && (size_t)kids[nk] <= n && refs[kids[nk]]++)
					rc = kids[nk];
		}
	}
	free(refs);
	if (rc) {
		struct loc at = node_loc(file, yaml_document_get_node(doc, rc));

		cfg_err(lc, &at, NULL, "YAML anchors and aliases (&name, *name) are not supported "
			"in a config: write the value out (or use include:)");
		return -EINVAL;
	}
	return 0;
}

static struct loc node_loc(const struct loc *base, const yaml_node_t *node)
{
	struct loc l = { base->file, 0, 0 };

	if (base->line < 0 || !node)
		return l;
	l.line = (int)node->start_mark.line + 1;
	l.col = (int)node->start_mark.column + 1;
	return l;
}

/* -------------------------------------------------------------------------------------------- */
/* the table */

static const struct key_def *find_key(const char *key)
{
	for (int i = 0; i < NKEYS; i++)
		if (!strcmp(keys[i].key, key))
			return &keys[i];
	return NULL;
}

static bool is_section(const char *name)
{
	for (int i = 0; sections[i]; i++)
		if (!strcmp(sections[i], name))
			return true;
	return false;
}

static const char *leaf_of(const char *key)
{
	const char *dot = strchr(key, '.');

	return dot ? dot + 1 : key;
}

/* length of the section part of "sec.leaf" (0 for a top-level key) */
static size_t section_len(const char *key)
{
	const char *dot = strchr(key, '.');

	return dot ? (size_t)(dot - key) : 0;
}

static void *field(const struct sl_config *cfg, const struct key_def *k)
{
	return (char *)cfg + k->off;
}

/* optimal string alignment distance: typos are mostly one slip or one swapped pair */
static int edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int d[64][64];

	if (la >= 64 || lb >= 64)
		return 99;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = (int)i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		for (size_t j = 1; j <= lb; j++) {
			int cost = a[i - 1] != b[j - 1];
			int v = d[i - 1][j] + 1;

			if (d[i][j - 1] + 1 < v)
				v = d[i][j - 1] + 1;
			if (d[i - 1][j - 1] + cost < v)
				v = d[i - 1][j - 1] + cost;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	}
	return d[la][lb];
}

/* short names get less slack, or "x" would suggest every two-letter key */
static bool near(const char *typed, int dist)
{
	return dist <= (strlen(typed) <= 3 ? 1 : 2);
}

/*
 * The closest known key to @typed ("train.bach", or a bare "batch"/"trian" at top level), or NULL.
 * A key counts as close when its full name is a near miss, or when its leaf is a near miss (the
 * user put the right name under the wrong section); a same-section leaf wins a tie.
 */
static const char *suggest(const char *typed)
{
	const char *best = NULL;
	int best_score = INT_MAX;
	const char *tleaf = leaf_of(typed);
	size_t tsec = section_len(typed);

	for (int i = 0; i < NKEYS; i++) {
		const char *k = keys[i].key;
		bool same_sec = section_len(k) == tsec && !strncmp(k, typed, tsec);
		int df = edit_distance(typed, k);
		int dl = edit_distance(tleaf, leaf_of(k));
		int score = INT_MAX;

		if (near(typed, df))
			score = 2 * df;
		if (near(tleaf, dl) && 2 * dl + !same_sec < score)
			score = 2 * dl + !same_sec;
		if (score < best_score) {
			best_score = score;
			best = k;
		}
	}
	if (tsec == 0) {	/* a misspelled section name at top level */
		for (int i = 0; sections[i]; i++) {
			int d = edit_distance(typed, sections[i]);

			if (near(typed, d) && 2 * d < best_score) {
				best_score = 2 * d;
				best = sections[i];
			}
		}
	}
	return best;
}

/* "batch, accum, ..." for the keys of @sec (NULL: the top-level names) */
static void list_names(const char *sec, char *buf, size_t n)
{
	size_t used = 0;

	buf[0] = '\0';
	if (!sec) {
		for (int i = 0; sections[i] && used < n; i++)
			used += snprintf(buf + used, n - used, "%s%s", i ? ", " : "", sections[i]);
		for (int i = 0; i < NKEYS && used < n; i++)
			if (!section_len(keys[i].key))
				used += snprintf(buf + used, n - used, ", %s", keys[i].key);
		if (used < n)
			snprintf(buf + used, n - used, ", include");
		return;
	}
	for (int i = 0; i < NKEYS && used < n; i++) {
		const char *k = keys[i].key;

		if (section_len(k) == strlen(sec) && !strncmp(k, sec, strlen(sec)))
			used += snprintf(buf + used, n - used, "%s%s", used ? ", " : "", leaf_of(k));
	}
}

static void enum_names(const struct enum_val *v, char *buf, size_t n)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; v[i].name && used < n; i++)
		used += snprintf(buf + used, n - used, "%s%s", i ? "|" : "", v[i].name);
}

static const char *type_desc(const struct key_def *k, char *buf, size_t n)
{
	switch (k->type) {
	case K_STR:
		return "a string";
	case K_INT:
	case K_LONG:
		return "an integer";
	case K_DBL:
		return "a number";
	case K_BOOL:
		return "true or false";
	case K_PAIR:
		return "a list of 2 numbers like [0.9, 0.95]";
	case K_ENUM: {
		char names[128];

		enum_names(k->vals, names, sizeof(names));
		snprintf(buf, n, "one of %s", names);
		return buf;
	}
	}
	return "?";
}

static void range_desc(const struct key_def *k, char *buf, size_t n)
{
	if (isinf(k->hi))
		snprintf(buf, n, "must be %s %g", k->lo_open ? ">" : ">=", k->lo);
	else
		snprintf(buf, n, "must be in %c%g, %g%c", k->lo_open ? '(' : '[', k->lo, k->hi,
			 k->hi_open ? ')' : ']');
}

static bool in_range(const struct key_def *k, double v)
{
	if (k->lo_open ? !(v > k->lo) : !(v >= k->lo))
		return false;
	if (k->hi_open ? !(v < k->hi) : !(v <= k->hi))
		return false;
	return true;
}

/* -------------------------------------------------------------------------------------------- */
/* values */

static bool is_null_scalar(const yaml_node_t *n)
{
	const char *s = (const char *)n->data.scalar.value;

	if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return false;
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

static const char *node_kind(const yaml_node_t *n)
{
	switch (n->type) {
	case YAML_MAPPING_NODE:
		return "a mapping";
	case YAML_SEQUENCE_NODE:
		return "a list";
	default:
		return "nothing";
	}
}

/* @s as a double; false when it is not a whole finite number */
static bool parse_double(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return *s && !isspace((unsigned char)*s) && !*end && !errno && isfinite(*out);
}

static bool parse_bool(const char *s, bool *out)
{
	static const char *const t[] = { "true", "yes", "on" }, *const f[] = { "false", "no", "off" };

	for (int i = 0; i < 3; i++) {
		if (!strcasecmp(s, t[i]))
			return *out = true, true;
		if (!strcasecmp(s, f[i]))
			return *out = false, true;
	}
	return false;
}

static int check_range(struct load_ctx *lc, const struct key_def *k, const struct loc *at,
		       double v, const char *text)
{
	char desc[96];

	if (in_range(k, v))
		return 0;
	range_desc(k, desc, sizeof(desc));
	cfg_err(lc, at, k->key, "%s, got %s", desc, text);
	return -EINVAL;
}

/*
 * Store the YAML @node as the value of @k.  @base is the file (line 0) or the --set option
 * (line -1, which every message then names instead of a position).
 */
static int set_value(struct load_ctx *lc, const struct key_def *k, yaml_document_t *doc,
		     yaml_node_t *node, const struct loc *base)
{
	struct loc at = node_loc(base, node);
	void *f = field(lc->cfg, k);
	char desc[160];
	const char *s;

	if (k->type == K_PAIR) {
		double v[2];
		yaml_node_item_t *it;

		if (node->type != YAML_SEQUENCE_NODE ||
		    node->data.sequence.items.top - node->data.sequence.items.start != 2) {
			cfg_err(lc, &at, k->key, "expected %s, got %s", type_desc(k, desc, sizeof(desc)),
				node->type == YAML_SCALAR_NODE ?
				(is_null_scalar(node) ? "nothing" : "a single value") :
				node->type == YAML_SEQUENCE_NODE ? "a list of another length" :
				node_kind(node));
			return -EINVAL;
		}
		it = node->data.sequence.items.start;
		for (int i = 0; i < 2; i++) {
			yaml_node_t *e = yaml_document_get_node(doc, it[i]);
			struct loc eat = node_loc(base, e);

			if (e->type != YAML_SCALAR_NODE ||
			    !parse_double((const char *)e->data.scalar.value, &v[i])) {
				cfg_err(lc, &eat, k->key, "element %d: expected a number, got %s%s%s",
					i + 1, e->type == YAML_SCALAR_NODE ? "'" : "",
					e->type == YAML_SCALAR_NODE ?
					(const char *)e->data.scalar.value : node_kind(e),
					e->type == YAML_SCALAR_NODE ? "'" : "");
				return -EINVAL;
			}
			if (check_range(lc, k, &eat, v[i], (const char *)e->data.scalar.value))
				return -EINVAL;
		}
		memcpy(f, v, sizeof(v));
		return 0;
	}

	if (node->type != YAML_SCALAR_NODE) {
		cfg_err(lc, &at, k->key, "expected %s, got %s", type_desc(k, desc, sizeof(desc)),
			node_kind(node));
		return -EINVAL;
	}
	s = (const char *)node->data.scalar.value;

	if (k->type == K_STR) {
		if (is_null_scalar(node))
			s = "";
		if (strlen(s) != node->data.scalar.length) {
			cfg_err(lc, &at, k->key, "the value contains a NUL character");
			return -EINVAL;
		}
		if (strlen(s) >= k->size) {
			cfg_err(lc, &at, k->key, "value too long (%zu bytes, at most %zu)",
				strlen(s), k->size - 1);
			return -EINVAL;
		}
		memcpy(f, s, strlen(s) + 1);
		return 0;
	}
	if (is_null_scalar(node)) {
		cfg_err(lc, &at, k->key, "expected %s, got nothing", type_desc(k, desc, sizeof(desc)));
		return -EINVAL;
	}

	switch (k->type) {
	case K_INT:
	case K_LONG: {
		char *end;
		long long v;

		errno = 0;
		v = strtoll(s, &end, 10);
		if (!*s || isspace((unsigned char)*s) || *end) {
			cfg_err(lc, &at, k->key, "expected an integer, got '%s'", s);
			return -EINVAL;
		}
		if (errno == ERANGE || (k->type == K_INT && (v < INT_MIN || v > INT_MAX)) ||
		    (k->type == K_LONG && (v < LONG_MIN || v > LONG_MAX))) {
			cfg_err(lc, &at, k->key, "%s does not fit in a %d-bit integer", s,
				k->type == K_INT ? 32 : (int)sizeof(long) * 8);
			return -EINVAL;
		}
		if (check_range(lc, k, &at, (double)v, s))
			return -EINVAL;
		if (k->type == K_INT)
			*(int *)f = (int)v;
		else
			*(long *)f = (long)v;
		return 0;
	}
	case K_DBL: {
		double v;

		if (!parse_double(s, &v)) {
			cfg_err(lc, &at, k->key, "expected a number (like 1e-5 or 0.1), got '%s'", s);
			return -EINVAL;
		}
		if (check_range(lc, k, &at, v, s))
			return -EINVAL;
		*(double *)f = v;
		return 0;
	}
	case K_BOOL:
		if (!parse_bool(s, (bool *)f)) {
			cfg_err(lc, &at, k->key, "expected true or false (or yes/no, on/off), got '%s'",
				s);
			return -EINVAL;
		}
		return 0;
	case K_ENUM:
		for (int i = 0; k->vals[i].name; i++) {
			if (!strcasecmp(s, k->vals[i].name)) {
				*(int *)f = k->vals[i].val;
				return 0;
			}
		}
		cfg_err(lc, &at, k->key, "expected %s, got '%s'", type_desc(k, desc, sizeof(desc)),
			s);
		return -EINVAL;
	default:
		return -EINVAL;
	}
}

/*
 * Parse @text as a one-document YAML value and store it in @k: --set values and the table's
 * defaults take this path, so they read exactly like the same text in a file.
 */
static int set_from_text(struct load_ctx *lc, const struct key_def *k, const char *text,
			 const struct loc *base)
{
	yaml_parser_t parser;
	yaml_document_t doc;
	yaml_node_t *root, empty = { 0 };
	int rc;

	if (!yaml_parser_initialize(&parser))
		return -ENOMEM;
	yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
	if (!yaml_parser_load(&parser, &doc)) {
		/* not YAML (e.g. "a: b" or an unbalanced quote): a string key takes it verbatim */
		if (k->type == K_STR && strlen(text) < k->size) {
			memcpy(field(lc->cfg, k), text, strlen(text) + 1);
			rc = 0;
		} else {
			cfg_err(lc, base, k->key, "cannot read the value as YAML: %s",
				parser.problem ? parser.problem : "syntax error");
			rc = -EINVAL;
		}
		goto out_free_parser;
	}
	root = yaml_document_get_root_node(&doc);
	if (!root) {	/* "key=" : an empty value, as an empty plain scalar is in a file */
		empty.type = YAML_SCALAR_NODE;
		empty.data.scalar.value = (yaml_char_t *)"";
		empty.data.scalar.length = 0;
		empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
		root = &empty;
	}
	if (k->type == K_STR && root->type != YAML_SCALAR_NODE && strlen(text) < k->size) {
		memcpy(field(lc->cfg, k), text, strlen(text) + 1);
		rc = 0;
		goto out_free_doc;
	}
	rc = set_value(lc, k, &doc, root, base);
out_free_doc:
	yaml_document_delete(&doc);
out_free_parser:
	yaml_parser_delete(&parser);
	return rc;
}

/* -------------------------------------------------------------------------------------------- */
/* files */

static const char *keep_name(struct load_ctx *lc, const char *name)
{
	char **n = realloc(lc->names, (lc->nnames + 1) * sizeof(*n));

	if (!n)
		return NULL;
	lc->names = n;
	n[lc->nnames] = strdup(name);
	if (!n[lc->nnames])
		return NULL;
	return n[lc->nnames++];
}

static void mark_set(struct load_ctx *lc, const struct key_def *k, const struct loc *at)
{
	lc->set_at[k - keys] = *at;
}

/* Every mapping's keys must be plain, distinct names. */
static int check_mapping_keys(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *map,
			      const char *sec, const struct loc *file)
{
	yaml_node_pair_t *p0 = map->data.mapping.pairs.start, *end = map->data.mapping.pairs.top;
	int rc = 0;

	for (yaml_node_pair_t *p = p0; p < end; p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		struct loc at = node_loc(file, kn);

		if (kn->type != YAML_SCALAR_NODE) {
			cfg_err(lc, &at, sec, "a key must be a name, got %s", node_kind(kn));
			rc = -EINVAL;
			continue;
		}
		for (yaml_node_pair_t *q = p0; q < p; q++) {
			yaml_node_t *qn = yaml_document_get_node(doc, q->key);
			char full[300];

			if (qn->type != YAML_SCALAR_NODE ||
			    strcmp((char *)qn->data.scalar.value, (char *)kn->data.scalar.value))
				continue;
			snprintf(full, sizeof(full), "%s%s%s", sec ? sec : "", sec ? "." : "",
				 (char *)kn->data.scalar.value);
			cfg_err(lc, &at, full, "duplicate key (first at line %d, column %d); keep one",
				(int)qn->start_mark.line + 1, (int)qn->start_mark.column + 1);
			rc = -EINVAL;
			break;
		}
	}
	return rc;
}

static int load_file(struct load_ctx *lc, const char *path, const struct loc *from);

static int load_includes(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *val,
			 const char *path, const struct loc *file)
{
	yaml_node_item_t *items = NULL;
	int n = 0, rc = 0;
	const char *slash = strrchr(path, '/');
	int dirlen = slash ? (int)(slash - path) + 1 : 0;

	if (val->type == YAML_SCALAR_NODE) {
		if (is_null_scalar(val))
			return 0;
	} else if (val->type == YAML_SEQUENCE_NODE) {
		items = val->data.sequence.items.start;
		n = (int)(val->data.sequence.items.top - items);
	} else {
		struct loc at = node_loc(file, val);

		cfg_err(lc, &at, "include", "expected a file name or a list of them, got %s",
			node_kind(val));
		return -EINVAL;
	}

	for (int i = 0; i < (items ? n : 1); i++) {
		yaml_node_t *e = items ? yaml_document_get_node(doc, items[i]) : val;
		struct loc at = node_loc(file, e);
		const char *name = (const char *)e->data.scalar.value;
		char resolved[SL_PATH_MAX];

		if (e->type != YAML_SCALAR_NODE || is_null_scalar(e)) {
			cfg_err(lc, &at, "include", "expected a file name, got %s",
				e->type == YAML_SCALAR_NODE ? "nothing" : node_kind(e));
			return -EINVAL;
		}
		/* relative to the including file, so a config tree works from any directory */
		if (name[0] == '/')
			rc = snprintf(resolved, sizeof(resolved), "%s", name);
		else
			rc = snprintf(resolved, sizeof(resolved), "%.*s%s", dirlen, path, name);
		if (rc < 0 || rc >= (int)sizeof(resolved)) {
			cfg_err(lc, &at, "include", "path too long");
			return -EINVAL;
		}
		rc = load_file(lc, resolved, &at);
		if (rc)
			return rc;
	}
	return 0;
}

/* Apply the keys of one section mapping ("train: {...}"). */
static int apply_section(struct load_ctx *lc, yaml_document_t *doc, const char *sec,
			 yaml_node_t *map, const struct loc *file)
{
	int rc = 0;

	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		yaml_node_t *vn = yaml_document_get_node(doc, p->value);
		struct loc at = node_loc(file, kn);
		const struct key_def *k;
		const char *hint;
		char full[300];

		if (kn->type != YAML_SCALAR_NODE)
			continue;	/* reported by check_mapping_keys */
		snprintf(full, sizeof(full), "%s.%s", sec, (char *)kn->data.scalar.value);
		k = find_key(full);
		if (!k) {
			char names[512];

			hint = suggest(full);
			if (hint) {
				cfg_err(lc, &at, full, "unknown key; did you mean '%s'?", hint);
			} else {
				list_names(sec, names, sizeof(names));
				cfg_err(lc, &at, full, "unknown key; the keys of '%s' are: %s", sec,
					names);
			}
			rc = -EINVAL;
			continue;
		}
		if (set_value(lc, k, doc, vn, file)) {
			rc = -EINVAL;
			continue;
		}
		mark_set(lc, k, &at);
	}
	return rc;
}

static int apply_top(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *root,
		     const struct loc *file)
{
	int rc = 0;

	for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
	     p < root->data.mapping.pairs.top; p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		yaml_node_t *vn = yaml_document_get_node(doc, p->value);
		struct loc at = node_loc(file, kn);
		const char *name;
		const struct key_def *k;

		if (kn->type != YAML_SCALAR_NODE)
			continue;	/* reported by check_mapping_keys */
		name = (const char *)kn->data.scalar.value;
		if (!strcmp(name, "include"))
			continue;	/* merged already */
		if (is_section(name)) {
			if (vn->type == YAML_MAPPING_NODE) {
				if (check_mapping_keys(lc, doc, vn, name, file) ||
				    apply_section(lc, doc, name, vn, file))
					rc = -EINVAL;
			} else if (vn->type != YAML_SCALAR_NODE || !is_null_scalar(vn)) {
				struct loc vat = node_loc(file, vn);
				char names[512];

				list_names(name, names, sizeof(names));
				cfg_err(lc, &vat, name, "expected a mapping of %s's keys (%s), got "
					"%s%s%s", name, names, vn->type == YAML_SCALAR_NODE ? "'" : "",
					vn->type == YAML_SCALAR_NODE ?
					(char *)vn->data.scalar.value : node_kind(vn),
					vn->type == YAML_SCALAR_NODE ? "'" : "");
				rc = -EINVAL;
			}
			continue;
		}
		k = find_key(name);
		if (k && !section_len(k->key)) {
			if (set_value(lc, k, doc, vn, file))
				rc = -EINVAL;
			else
				mark_set(lc, k, &at);
			continue;
		}
		if (k) {
			cfg_err(lc, &at, name, "dotted keys are for --set; in a file write "
				"'%.*s: {%s: ...}'", (int)section_len(name), name, leaf_of(name));
		} else {
			const char *hint = suggest(name);
			char names[512];

			if (hint) {
				cfg_err(lc, &at, name, "unknown section; did you mean '%s'?", hint);
			} else {
				list_names(NULL, names, sizeof(names));
				cfg_err(lc, &at, name, "unknown section; the top-level names are: %s",
					names);
			}
		}
		rc = -EINVAL;
	}
	return rc;
}

/*
 * Read @path into lc->cfg: its includes first, then its own keys.  @from: the include entry that
 * named it (NULL for the top-level file), which is where "cannot open" is reported.
 */
static int load_file(struct load_ctx *lc, const char *path, const struct loc *from)
{
	yaml_parser_t parser;
	yaml_document_t doc, extra;
	yaml_node_t *root;
	struct loc file;
	char *real = NULL;
	FILE *fp;
	int rc = 0;

	file.file = keep_name(lc, path);
	file.line = file.col = 0;
	if (!file.file)
		return -ENOMEM;

	fp = fopen(path, "r");
	if (!fp) {
		int e = errno;

		if (from)
			cfg_err(lc, from, "include", "cannot open '%s': %s", path, strerror(e));
		else
			cfg_err(lc, &file, NULL, "cannot open the config file: %s", strerror(e));
		return e == ENOENT ? -ENOENT : -EIO;
	}
	real = realpath(path, NULL);
	if (!real) {
		rc = -errno;
		cfg_err(lc, from ? from : &file, from ? "include" : NULL,
			"cannot resolve the path of '%s': %s", path, strerror(-rc));
		goto out_close;
	}
	for (int i = 0; i < lc->depth; i++) {
		char chain[2048];
		size_t used = 0;

		if (strcmp(lc->stack[i].real, real))
			continue;
		for (int j = i; j < lc->depth && used < sizeof(chain); j++)
			used += snprintf(chain + used, sizeof(chain) - used, "%s -> ",
					 lc->stack[j].shown);
		if (used < sizeof(chain))
			snprintf(chain + used, sizeof(chain) - used, "%s", path);
		cfg_err(lc, from, "include", "include cycle: %s; remove one of these includes",
			chain);
		rc = -EINVAL;
		goto out_free_real;
	}
	if (lc->depth == MAX_INCLUDE_DEPTH) {
		cfg_err(lc, from, "include", "includes nested deeper than %d files",
			MAX_INCLUDE_DEPTH);
		rc = -EINVAL;
		goto out_free_real;
	}

	if (!yaml_parser_initialize(&parser)) {
		rc = -ENOMEM;
		goto out_free_real;
	}
	yaml_parser_set_input_file(&parser, fp);
	if (!yaml_parser_load(&parser, &doc)) {
		struct loc at = { path, (int)parser.problem_mark.line + 1,
				  (int)parser.problem_mark.column + 1 };

		if (parser.context)
			cfg_err(lc, &at, NULL, "YAML syntax error: %s (%s at line %d, column %d)",
				parser.problem, parser.context, (int)parser.context_mark.line + 1,
				(int)parser.context_mark.column + 1);
		else
			cfg_err(lc, &at, NULL, "YAML syntax error: %s",
				parser.problem ? parser.problem : "cannot parse");
		rc = -EINVAL;
		goto out_free_parser;
	}
	root = yaml_document_get_root_node(&doc);
	if (root) {	/* a second document would be silently ignored: refuse it */
		if (!yaml_parser_load(&parser, &extra)) {
			struct loc at = { path, (int)parser.problem_mark.line + 1,
					  (int)parser.problem_mark.column + 1 };

			cfg_err(lc, &at, NULL, "YAML syntax error: %s",
				parser.problem ? parser.problem : "cannot parse");
			rc = -EINVAL;
			goto out_free_doc;
		}
		if (yaml_document_get_root_node(&extra)) {
			struct loc at = { path, (int)extra.start_mark.line + 1,
					  (int)extra.start_mark.column + 1 };

			cfg_err(lc, &at, NULL, "a second YAML document; a config is one document");
			rc = -EINVAL;
		}
		yaml_document_delete(&extra);
		if (rc)
			goto out_free_doc;
	}
	if (!root || (root->type == YAML_SCALAR_NODE && is_null_scalar(root)))
		goto out_free_doc;	/* an empty file sets nothing */
	rc = refuse_aliases(lc, &doc, &file);
	if (rc)
		goto out_free_doc;
	if (root->type != YAML_MAPPING_NODE) {
		struct loc at = node_loc(&file, root);

		cfg_err(lc, &at, NULL, "expected a mapping of sections (model:, data:, train:, ...) "
			"at the top level, got %s", root->type == YAML_SCALAR_NODE ? "a scalar" :
			node_kind(root));
		rc = -EINVAL;
		goto out_free_doc;
	}
	rc = check_mapping_keys(lc, &doc, root, NULL, &file);
	if (rc)
		goto out_free_doc;

	lc->stack[lc->depth].shown = file.file;
	lc->stack[lc->depth].real = real;
	lc->depth++;
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
	     p < root->data.mapping.pairs.top && !rc; p++) {
		yaml_node_t *kn = yaml_document_get_node(&doc, p->key);

		if (!strcmp((char *)kn->data.scalar.value, "include"))
			rc = load_includes(lc, &doc, yaml_document_get_node(&doc, p->value), path,
					   &file);
	}
	lc->depth--;
	if (!rc)
		rc = apply_top(lc, &doc, root, &file);

out_free_doc:
	yaml_document_delete(&doc);
out_free_parser:
	yaml_parser_delete(&parser);
out_free_real:
	free(real);
out_close:
	fclose(fp);
	return rc;
}

/* One "key=value" override. */
static int apply_set(struct load_ctx *lc, const char *opt)
{
	char label[SL_PATH_MAX + 8], key[256];
	const char *eq = strchr(opt, '=');
	struct loc at;
	const struct key_def *k;
	size_t klen;

	snprintf(label, sizeof(label), "--set %s", opt);
	at.file = keep_name(lc, label);
	at.line = -1;	/* positions inside a --set value mean nothing to the user */
	at.col = 0;
	if (!at.file)
		return -ENOMEM;
	if (!eq) {
		at.line = 0;
		cfg_err(lc, &at, NULL, "expected KEY=VALUE, like --set train.batch=2");
		return -EINVAL;
	}
	klen = (size_t)(eq - opt);
	while (klen && isspace((unsigned char)opt[klen - 1]))
		klen--;
	while (klen && isspace((unsigned char)*opt))
		opt++, klen--;
	if (klen >= sizeof(key))
		klen = sizeof(key) - 1;
	memcpy(key, opt, klen);
	key[klen] = '\0';

	k = find_key(key);
	at.line = 0;
	if (!k) {
		const char *hint = suggest(key);

		if (!strcmp(key, "include"))
			cfg_err(lc, &at, key, "include works only in files");
		else if (is_section(key))
			cfg_err(lc, &at, key, "a section; set one of its keys, like --set %s.KEY=VALUE",
				key);
		else if (hint)
			cfg_err(lc, &at, key, "unknown key; did you mean '%s'?", hint);
		else
			cfg_err(lc, &at, key, "unknown key; 'shardlm config CONFIG' lists every key");
		return -EINVAL;
	}
	at.line = -1;
	if (set_from_text(lc, k, eq + 1, &at))
		return -EINVAL;
	at.line = 0;
	mark_set(lc, k, &at);
	return 0;
}

/* Checks that involve more than one key, after everything is merged. */
static int validate(struct load_ctx *lc, bool require_train, const char *top)
{
	struct sl_config *c = lc->cfg;
	struct loc dflt = { top ? top : "(config)", 0, 0 };
	int rc = 0;

	for (int i = 0; require_train && i < NKEYS; i++) {
		const char *v = field(c, &keys[i]);

		if (!keys[i].required || *v)
			continue;
		cfg_err(lc, &dflt, NULL, "missing required key %s (%s); add '%.*s: {%s: ...}' or "
			"pass --set %s=...", keys[i].key, dflt.file, (int)section_len(keys[i].key),
			keys[i].key, leaf_of(keys[i].key), keys[i].key);
		rc = -EINVAL;
	}

	if (c->train.steps == 0 && c->train.epochs == 0) {
		const struct loc *at = &lc->set_at[find_key("train.steps") - keys];

		cfg_err(lc, at->file ? at : &dflt, "train.steps",
			"0 means 'from train.epochs', but train.epochs is 0 too; set either");
		rc = -EINVAL;
	}
	if (c->optim.min_lr > c->optim.lr) {
		const struct loc *at = &lc->set_at[find_key("optim.min_lr") - keys];

		cfg_err(lc, at->file ? at : &dflt, "optim.min_lr", "%g is above optim.lr (%g); "
			"the schedule decays from lr down to min_lr", c->optim.min_lr, c->optim.lr);
		rc = -EINVAL;
	}
	return rc;
}

/* -------------------------------------------------------------------------------------------- */
/* public */

void sl_config_defaults(struct sl_config *cfg)
{
	struct load_ctx lc = { .cfg = cfg, .err = stderr };
	struct loc at = { "(built-in default)", -1, 0 };

	memset(cfg, 0, sizeof(*cfg));
	for (int i = 0; i < NKEYS; i++)
		if (set_from_text(&lc, &keys[i], keys[i].def, &at))
			abort();	/* the table itself is wrong */
}

static void set_name(struct sl_config *cfg, const char *path)
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".yaml"))
		n -= 5;
	else if (n > 4 && !strcmp(base + n - 4, ".yml"))
		n -= 4;
	if (n >= sizeof(cfg->name))
		n = sizeof(cfg->name) - 1;
	memcpy(cfg->name, base, n);
	cfg->name[n] = '\0';
}

int sl_config_load_err(struct sl_config *cfg, const char *path, char *const *set, int nset,
		       bool require_train, FILE *err)
{
	struct load_ctx lc = { .cfg = cfg, .err = err ? err : stderr };
	const struct key_def *dir = find_key("run.dir");
	int rc = 0;

	sl_config_defaults(cfg);
	if (path) {
		struct loc at = { path, 0, 0 };

		if (!*path || strlen(path) >= sizeof(cfg->source)) {
			at.file = "shardlm";
			cfg_err(&lc, &at, NULL, "config file name %s", *path ? "too long" : "is empty");
			return -EINVAL;
		}
		strcpy(cfg->source, path);
		set_name(cfg, path);
		rc = load_file(&lc, path, NULL);
	}
	for (int i = 0; !rc && i < nset; i++)
		if (apply_set(&lc, set[i]))
			rc = -EINVAL;
	if (!rc && lc.nerr)
		rc = -EINVAL;
	if (!rc && !lc.set_at[dir - keys].file && cfg->name[0])
		snprintf(cfg->run.dir, sizeof(cfg->run.dir), "runs/%s", cfg->name);
	if (!rc)
		rc = validate(&lc, require_train, path);

	for (int i = 0; i < lc.nnames; i++)
		free(lc.names[i]);
	free(lc.names);
	return rc;
}

int sl_config_load(struct sl_config *cfg, const char *path, char *const *set, int nset,
		   bool require_train)
{
	return sl_config_load_err(cfg, path, set, nset, require_train, stderr);
}

/* shortest text that reads back as the same double; always with a '.' or exponent */
static void format_double(double v, char *buf, size_t n)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	if (!strpbrk(buf, ".eEn"))
		strncat(buf, ".0", n - strlen(buf) - 1);
}

static const char *enum_name(const struct key_def *k, int v)
{
	for (int i = 0; k->vals[i].name; i++)
		if (k->vals[i].val == v)
			return k->vals[i].name;
	return "?";
}

static void format_value(const struct sl_config *cfg, const struct key_def *k, char *buf,
			 size_t n)
{
	const void *f = field(cfg, k);

	switch (k->type) {
	case K_STR:
		snprintf(buf, n, "%s", (const char *)f);
		break;
	case K_INT:
		snprintf(buf, n, "%d", *(const int *)f);
		break;
	case K_LONG:
		snprintf(buf, n, "%ld", *(const long *)f);
		break;
	case K_DBL:
		format_double(*(const double *)f, buf, n);
		break;
	case K_BOOL:
		snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false");
		break;
	case K_ENUM:
		snprintf(buf, n, "%s", enum_name(k, *(const int *)f));
		break;
	case K_PAIR: {
		char a[32], b[32];

		format_double(((const double *)f)[0], a, sizeof(a));
		format_double(((const double *)f)[1], b, sizeof(b));
		snprintf(buf, n, "[%s, %s]", a, b);
		break;
	}
	}
}

int sl_config_format(const struct sl_config *cfg, const char *key, char *buf, size_t n)
{
	const struct key_def *k = find_key(key);

	if (!k)
		return -ENOENT;
	format_value(cfg, k, buf, n);
	return 0;
}

void sl_config_print_table(const struct sl_config *cfg, FILE *out)
{
	char val[SL_PATH_MAX + 8];
	int width = 0;

	for (int i = 0; i < NKEYS; i++)
		if ((int)strlen(keys[i].key) > width)
			width = (int)strlen(keys[i].key);
	for (int i = 0; i < NKEYS; i++) {
		format_value(cfg, &keys[i], val, sizeof(val));
		/* an empty string would look like a missing column */
		fprintf(out, "%-*s  %s\n", width, keys[i].key, val[0] ? val : "\"\"");
	}
}

/* Would a YAML reader take @s as something other than a string when written plain? */
static bool needs_quotes(const char *s)
{
	double d;
	bool b;

	return !*s || parse_double(s, &d) || parse_bool(s, &b) || !strcmp(s, "~") ||
	       !strcasecmp(s, "null") || !strcmp(s, "y") || !strcmp(s, "n") ||
	       !strcmp(s, ".inf") || !strcmp(s, ".nan");
}

static int emit(yaml_emitter_t *em, yaml_event_t *ev, int ok)
{
	if (!ok)
		return -ENOMEM;
	return yaml_emitter_emit(em, ev) ? 0 : -EIO;
}

static int emit_scalar(yaml_emitter_t *em, const char *s, yaml_scalar_style_t style)
{
	yaml_event_t ev;

	return emit(em, &ev, yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s,
							  (int)strlen(s), 1, 1, style));
}

int sl_config_write_yaml(const struct sl_config *cfg, FILE *out)
{
	yaml_emitter_t em;
	yaml_event_t ev;
	char val[SL_PATH_MAX + 8];
	size_t open_sec = 0;	/* length of the section whose mapping is open, 0 = none */
	const char *sec = NULL;
	int rc;

	fprintf(out, "# resolved config%s%s (written by shardlm; every key)\n",
		cfg->source[0] ? " of " : "", cfg->source);
	if (!yaml_emitter_initialize(&em))
		return -ENOMEM;
	yaml_emitter_set_output_file(&em, out);
	yaml_emitter_set_width(&em, -1);
	yaml_emitter_set_unicode(&em, 1);

	rc = emit(&em, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
	if (!rc)
		rc = emit(&em, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
	if (!rc)
		rc = emit(&em, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
									YAML_BLOCK_MAPPING_STYLE));
	for (int i = 0; !rc && i < NKEYS; i++) {
		const struct key_def *k = &keys[i];
		size_t slen = section_len(k->key);

		if (open_sec && (slen != open_sec || strncmp(k->key, sec, slen))) {
			rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
			open_sec = 0;
		}
		if (!rc && slen && !open_sec) {
			char name[64];

			snprintf(name, sizeof(name), "%.*s", (int)slen, k->key);
			rc = emit_scalar(&em, name, YAML_PLAIN_SCALAR_STYLE);
			if (!rc)
				rc = emit(&em, &ev, yaml_mapping_start_event_initialize(&ev, NULL,
						NULL, 1, YAML_BLOCK_MAPPING_STYLE));
			open_sec = slen;
			sec = k->key;
		}
		if (!rc)
			rc = emit_scalar(&em, leaf_of(k->key), YAML_PLAIN_SCALAR_STYLE);
		if (rc)
			break;
		if (k->type == K_PAIR) {
			const double *v = field(cfg, k);

			rc = emit(&em, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
						YAML_FLOW_SEQUENCE_STYLE));
			for (int j = 0; !rc && j < 2; j++) {
				format_double(v[j], val, sizeof(val));
				rc = emit_scalar(&em, val, YAML_PLAIN_SCALAR_STYLE);
			}
			if (!rc)
				rc = emit(&em, &ev, yaml_sequence_end_event_initialize(&ev));
			continue;
		}
		format_value(cfg, k, val, sizeof(val));
		rc = emit_scalar(&em, val, k->type == K_STR && needs_quotes(val) ?
				 YAML_DOUBLE_QUOTED_SCALAR_STYLE : k->type == K_STR ?
				 YAML_ANY_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE);
	}
	if (!rc && open_sec)
		rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
	if (!rc)
		rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
	if (!rc)
		rc = emit(&em, &ev, yaml_document_end_event_initialize(&ev, 1));
	if (!rc)
		rc = emit(&em, &ev, yaml_stream_end_event_initialize(&ev));
	if (!rc && !yaml_emitter_flush(&em))
		rc = -EIO;
	yaml_emitter_delete(&em);
	if (!rc && ferror(out))
		rc = -EIO;
	return rc;
}

static bool ignored(const char *key, const char *const *ignore)
{
	for (int i = 0; ignore && ignore[i]; i++) {
		size_t n = strlen(ignore[i]);

		if (n && ignore[i][n - 1] == '.' ? !strncmp(key, ignore[i], n) :
		    !strcmp(key, ignore[i]))
			return true;
	}
	return false;
}

int sl_config_diff_ignoring(const struct sl_config *a, const struct sl_config *b,
			    const char *const *ignore, char *key, size_t n)
{
	for (int i = 0; i < NKEYS; i++) {
		const struct key_def *k = &keys[i];
		const void *fa = field(a, k), *fb = field(b, k);
		bool same;

		if (ignored(k->key, ignore))
			continue;
		switch (k->type) {
		case K_STR:
			same = !strcmp(fa, fb);
			break;
		case K_DBL:
			same = *(const double *)fa == *(const double *)fb;
			break;
		case K_PAIR:
			same = ((const double *)fa)[0] == ((const double *)fb)[0] &&
			       ((const double *)fa)[1] == ((const double *)fb)[1];
			break;
		default:	/* integers, bools, enums: the bytes are the value */
			same = !memcmp(fa, fb, k->size);
			break;
		}
		if (!same) {
			if (key && n)
				snprintf(key, n, "%s", k->key);
			return 1;
		}
	}
	if (key && n)
		key[0] = '\0';
	return 0;
}

int sl_config_diff(const struct sl_config *a, const struct sl_config *b, char *key, size_t n)
{
	return sl_config_diff_ignoring(a, b, NULL, key, n);
}

const char *sl_task_name(enum sl_task t)
{
	return enum_name(find_key("task"), t);
}

const char *sl_precision_name(enum sl_precision p)
{
	return enum_name(find_key("precision.compute"), p);
}

const char *sl_backend_name(enum sl_backend_kind b)
{
	return enum_name(find_key("backend"), b);
}

const char *sl_schedule_name(enum sl_schedule s)
{
	return enum_name(find_key("optim.schedule"), s);
}

const char *sl_offload_name(enum sl_offload o)
{
	return enum_name(find_key("parallel.offload"), o);
}
