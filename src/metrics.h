/*
 * metrics: the run's machine-readable files.
 *
 * RUN/training_metrics.json ({"run": {...}, "steps": [...], "eval": [...]}, a step or evaluation
 * a line), rewritten through a temporary file and rename after every step (by a writer thread,
 * so the step does not wait for the file) so a dead job still leaves its steps, and
 * RUN/provenance.json (versions, hosts, ranks, libraries, NCCL_* environment, input hashes).
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sl_step_metrics {
	int step;			/* 1-based */
	double time_s;			/* wall seconds of the step */
	double end_unix;		/* when it ended */
	double loss;
	double lr;
	double grad_norm;
	long records;
	long tokens;			/* real tokens */
	long padded_tokens;		/* padding added to micro-batches */
	long targets;			/* sft: target tokens (the loss's denominator); 0: classify */
	long long peak_gpu_bytes;	/* 0 on the cpu backend */
	long long reserved_gpu_bytes;	/* the cuda arena's chunks + fixed workspaces; 0: cpu */
	long long device_used_bytes;	/* the device's used memory (all of it: context, libraries)
					 * at the step's end; 0: cpu */
	bool skipped;			/* non-finite loss or gradient: no update */
	/* mixture of experts: "expert_tokens": {min, max, total} per MoE layer */
	int moe_layers;			/* 0: no MoE layer, no expert_tokens */
	int n_experts;
	const long long *expert_tokens;	/* (moe_layers, n_experts) tokens each expert got */
	bool capacity;			/* parallel.capacity_factor > 0: "dropped_tokens" */
	long long dropped_tokens;	/* expert choices over capacity, all layers and ranks */
};

struct sl_metrics;

/* @path: RUN/training_metrics.json */
struct sl_metrics *sl_metrics_create(const char *path);
void sl_metrics_destroy(struct sl_metrics *m);
void sl_metrics_run_int(struct sl_metrics *m, const char *key, long long v);
void sl_metrics_run_double(struct sl_metrics *m, const char *key, double v);
void sl_metrics_run_string(struct sl_metrics *m, const char *key, const char *v);
void sl_metrics_add_step(struct sl_metrics *m, const struct sl_step_metrics *s);
void sl_metrics_add_eval(struct sl_metrics *m, int step, double loss, long records);
/*
 * Resuming: take the steps (and evaluations) up to @max_step from an earlier run's
 * training_metrics.json at @path; a missing file keeps nothing.  Returns how many steps were kept.
 */
int sl_metrics_keep_earlier(struct sl_metrics *m, const char *path, int max_step);
void sl_metrics_add_eval_stats(struct sl_metrics *m, int step, long records, int n,
			       const char *const *keys, const double *values);
/*
 * Atomic rewrite (temp file + fsync + rename), here and now (after any pending asynchronous one).
 * 0, or negative when this or an earlier asynchronous write failed (the error is logged).
 */
int sl_metrics_write(struct sl_metrics *m);
/*
 * The same rewrite by a writer thread (started on first use), so the caller does not wait for
 * the file: the thread writes the latest document it was handed, a newer one replacing one it
 * had not begun.  Returns negative when an earlier write failed, else 0.
 */
int sl_metrics_write_async(struct sl_metrics *m);
/* Waits until the writer thread has written the latest document; 0, or negative as above. */
int sl_metrics_flush(struct sl_metrics *m);

/* 64-bit FNV-1a of a file's bytes (provenance, not security); 0 and *bytes = -1 if unreadable. */
uint64_t sl_file_hash(const char *path, long long *bytes);

struct sl_provenance_input {
	const char *config_path;
	const char *model_dir;
	const char *train_path;
	const char *valid_path;		/* may be "" */
	const char *tokenizer_path;	/* may be NULL */
	int argc;
	char **argv;
	int world;
	const char *backend;
};
int sl_provenance_write(const char *path, const struct sl_provenance_input *in);

/* Write @text to @path atomically (temp + fsync + rename). */
int sl_write_file_atomic(const char *path, const char *text, size_t len);

#endif
