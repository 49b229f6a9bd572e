/*
 * config: YAML files -> struct sl_config.
 *
 * Owns the config keys of DESIGN.md §3.  One table, cfg_keys[], names every key with its type,
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
 *
 * This file holds the table and what looks keys up in it (lookups, "did you mean" suggestions);
 * config_value.c stores one YAML value into one key, config_load.c reads files and --set
 * options and validates, config_print.c prints, writes and compares resolved configs;
 * config_impl.h is what they share.
 */
#include "config_impl.h"

#include <limits.h>

/* enum fields are stored through an int pointer */
_Static_assert(sizeof(enum sl_task) == sizeof(int), "enum size");
_Static_assert(sizeof(enum sl_precision) == sizeof(int), "enum size");

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
const struct key_def cfg_keys[] = {
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
const int cfg_nkeys = (int)(sizeof(cfg_keys) / sizeof(cfg_keys[0]));
_Static_assert(sizeof(cfg_keys) / sizeof(cfg_keys[0]) <= MAX_KEYS,
	       "more keys than MAX_KEYS (config_impl.h)");

static const char *const sections[] = {
	"model", "data", "train", "optim", "precision", "parallel", "checkpoint", "export", "run",
	"gpu_log", NULL
};

/* -------------------------------------------------------------------------------------------- */
/* the table */

const struct key_def *cfg_find_key(const char *key)
{
	for (int i = 0; i < NKEYS; i++)
		if (!strcmp(cfg_keys[i].key, key))
			return &cfg_keys[i];
	return NULL;
}

bool cfg_is_section(const char *name)
{
	for (int i = 0; sections[i]; i++)
		if (!strcmp(sections[i], name))
			return true;
	return false;
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
const char *cfg_suggest(const char *typed)
{
	const char *best = NULL;
	int best_score = INT_MAX;
	const char *tleaf = leaf_of(typed);
	size_t tsec = section_len(typed);

	for (int i = 0; i < NKEYS; i++) {
		const char *k = cfg_keys[i].key;
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
void cfg_list_names(const char *sec, char *buf, size_t n)
{
	size_t used = 0;

	buf[0] = '\0';
	if (!sec) {
		for (int i = 0; sections[i] && used < n; i++)
			used += snprintf(buf + used, n - used, "%s%s", i ? ", " : "", sections[i]);
		for (int i = 0; i < NKEYS && used < n; i++)
			if (!section_len(cfg_keys[i].key))
				used += snprintf(buf + used, n - used, ", %s", cfg_keys[i].key);
		if (used < n)
			snprintf(buf + used, n - used, ", include");
		return;
	}
	for (int i = 0; i < NKEYS && used < n; i++) {
		const char *k = cfg_keys[i].key;

		if (section_len(k) == strlen(sec) && !strncmp(k, sec, strlen(sec)))
			used += snprintf(buf + used, n - used, "%s%s", used ? ", " : "", leaf_of(k));
	}
}
