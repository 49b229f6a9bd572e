/*
 * config: YAML files -> struct sl_config.
 *
 * Owns the key table of DESIGN.md §3 (names, types, defaults, ranges), `include:` merging,
 * `--set key=value` overrides, validation with file:line:col errors, and printing the resolved
 * config as a table and as YAML.  Depends on no other module of ours (libyaml only).
 */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define SL_PATH_MAX 4096

enum sl_task { SL_TASK_CLASSIFY, SL_TASK_SFT };
enum sl_backend_kind { SL_BACKEND_CUDA, SL_BACKEND_CPU };
enum sl_schedule { SL_SCHED_CONSTANT, SL_SCHED_LINEAR, SL_SCHED_COSINE };
enum sl_on_error { SL_ON_ERROR_FAIL, SL_ON_ERROR_SKIP };
enum sl_precision { SL_PREC_AUTO, SL_PREC_FP32, SL_PREC_BF16 };
enum sl_shard_group { SL_SHARD_WORLD, SL_SHARD_NODE };
enum sl_offload { SL_OFFLOAD_NONE, SL_OFFLOAD_OPTIMIZER, SL_OFFLOAD_PARAMS };

struct sl_config {
	char source[SL_PATH_MAX];	/* the top-level config file as given */
	char name[256];			/* config file name without directory and .yaml */

	struct {
		char path[SL_PATH_MAX];	/* required: HF model dir or HF cache dir */
		char revision[256];	/* "" = refs/main, else a snapshot name or ref */
	} model;

	enum sl_task task;

	struct {
		char train[SL_PATH_MAX];	/* required for train */
		char valid[SL_PATH_MAX];	/* "" = none */
		char text_field[128];
		char label_field[128];
		int max_state;			/* tokens; records longer are dropped */
		bool length_sort;
		bool shuffle;
		long seed;
		bool pack;
		enum sl_on_error on_error;
		bool keep_reasoning;
	} data;

	struct {
		int batch;			/* records per micro-batch per data-parallel rank */
		int accum;			/* micro-batches per optimizer step */
		int steps;			/* optimizer steps; 0 = from epochs */
		int epochs;			/* used when steps == 0 */
		bool activation_checkpointing;
		int eval_every;			/* steps; 0 = never */
		int max_bad_steps;
		bool deterministic;
	} train;

	struct {
		double lr;
		enum sl_schedule schedule;
		int warmup;			/* steps */
		double min_lr;
		double betas[2];
		double eps;
		double weight_decay;
		double clip;			/* global-norm clip; 0 = off */
		double head_lr_mult;
	} optim;

	enum sl_backend_kind backend;

	struct {
		enum sl_precision compute;	/* auto: bf16 on cuda, fp32 on cpu */
		enum sl_precision master;	/* fp32 */
		enum sl_precision reduce;	/* fp32 | bf16 */
	} precision;

	struct {
		enum sl_shard_group shard_group;
		int node_size;			/* ranks per node; 0 = detected */
		bool reshard_after_forward;
		int prefetch;			/* units ahead */
		int context;
		int expert;
		double capacity_factor;		/* 0 = no token dropped */
		enum sl_offload offload;
		int timeout_s;
	} parallel;

	struct {
		int every;			/* steps; 0 = none */
		int keep;
		char dir[SL_PATH_MAX];		/* relative to run.dir unless absolute */
		bool optimizer;
		int term_grace_s;		/* seconds after SIGTERM/SIGINT to stop with a
						 * checkpoint; 0 = exit at once */
	} checkpoint;

	struct {
		enum sl_precision dtype;	/* bf16 | fp32 */
		bool final;			/* export RUN/model at the end (benchmarks: false) */
	} export_;

	struct {
		char dir[SL_PATH_MAX];		/* default runs/<name> */
		int log_every;
	} run;

	struct {
		double every_s;
		char file[SL_PATH_MAX];
	} gpu_log;
};

/*
 * Fill @cfg with the defaults, read @path (with its includes), then apply the @nset overrides
 * "key=value" in order.  On error prints "FILE:LINE:COL: key: what is wrong ..." to stderr (one
 * line per error, every bad key of a file reported) and returns a negative value; @cfg is then
 * unusable.  Never exits.  @path NULL: defaults and @set only.
 * @require_train: the keys a training run needs (model.path, data.train) must be present.
 */
int sl_config_load(struct sl_config *cfg, const char *path, char *const *set, int nset,
		   bool require_train);

/* The same, printing errors to @err (NULL: stderr). */
int sl_config_load_err(struct sl_config *cfg, const char *path, char *const *set, int nset,
		       bool require_train, FILE *err);

/* Defaults only (for tests and tools). */
void sl_config_defaults(struct sl_config *cfg);

/* The resolved config as a two-column table (key, value), one line per key. */
void sl_config_print_table(const struct sl_config *cfg, FILE *out);

/* The resolved config as YAML that sl_config_load reads back to the same struct. */
int sl_config_write_yaml(const struct sl_config *cfg, FILE *out);

/*
 * 1 and the first key (table order, e.g. "optim.lr") whose value differs into @key (@n bytes),
 * or 0 when every key is equal.  source and name are not keys and are not compared.
 */
int sl_config_diff(const struct sl_config *a, const struct sl_config *b, char *key, size_t n);

/*
 * The same, skipping the keys in the NULL-terminated @ignore: a full key ("train.steps") or a
 * section prefix ending in '.' ("checkpoint.") -- for resumes, which may change some keys.
 */
int sl_config_diff_ignoring(const struct sl_config *a, const struct sl_config *b,
			    const char *const *ignore, char *key, size_t n);

/* The value of @key as sl_config_print_table shows it (e.g. "1e-05", "[0.9, 0.95]"); -ENOENT. */
int sl_config_format(const struct sl_config *cfg, const char *key, char *buf, size_t n);

/* Names of enum values, for logs. */
const char *sl_task_name(enum sl_task t);
const char *sl_precision_name(enum sl_precision p);
const char *sl_backend_name(enum sl_backend_kind b);
const char *sl_schedule_name(enum sl_schedule s);
const char *sl_offload_name(enum sl_offload o);

#endif
