/*
 * train_impl.h: the state of one `shardlm train` job, shared by train.c (which sets it up and
 * tears it down) and the files of what it runs: train_backend.c (the backend, the GPU log),
 * train_batch.c (micro-batches on the device), train_run.c (run directory, checkpoints, resume,
 * export), train_eval.c (validation), train_step.c (the step loop).  Only train*.c include it.
 */
#ifndef SL_TRAIN_IMPL_H
#define SL_TRAIN_IMPL_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "chat.h"
#include "config.h"
#include "context.h"
#include "data.h"
#include "dist.h"
#include "gpulog.h"
#include "metrics.h"
#include "model.h"
#include "modelio.h"
#include "moe_dist.h"
#include "shard.h"
#include "tb.h"
#include "tokenizer.h"
#include "train.h"

/* Device-side copy of a host batch (and, for sft, its targets). */
struct dev_batch {
	int32_t *ids, *lens, *last;
	float *labels;
	int32_t *tgt_pos, *tgt_ids;	/* (max_B * max_L) sft */
	int32_t *pos;			/* (max_B * max_L) packed rows */
	int32_t *h_tgt;			/* (2 * max_B * max_L) host: positions, then ids */
	struct sl_batch_dev view;
};

/* One `shardlm train` job: what train.c sets up and job_free releases. */
struct job {
	struct sl_cmd_args a;
	struct sl_config *c;
	struct sl_dist d;
	struct sl_groups g;
	bool have_groups;
	struct sl_comm xcomm;		/* parallel.expert > 1: the ranks holding the same experts */
	bool have_xcomm;
	int xq;				/* this rank's index in its expert group */
	struct sl_model_files mf;
	bool have_mf;
	struct sl_dataset train, valid;
	struct sl_backend *be;
	struct sl_shard sh;
	bool have_shard;
	struct sl_model *model;
	struct sl_sampler smp;
	struct sl_metrics *met;
	struct sl_host_batch hb;
	struct dev_batch db;
	char *yaml;
	struct sl_gpulog *gpulog;	/* node's local rank 0 */
	struct sl_tb *tb;		/* rank 0 */
	struct sl_tokenizer *tok;	/* the model's, NULL without tokenizer.json */
	struct sl_chat *chat;		/* sft: its chat template, NULL without one */
	char tok_path[SL_PATH_MAX + 32];
	bool cuda;			/* the cuda backend */
	int device;			/* its GPU */
	enum sl_comm_kind comm_kind;
	struct sl_comm_copy copy;	/* staged collectives: the backend's copies */
	int R, steps, max_L, first_step;
	char ckpt_root[SL_PATH_MAX + 64];
	int last_ckpt_step;		/* newest complete checkpoint of this run, 0 = none */
	double last_ckpt_s;		/* its write time, 0 = none written by this job */
	long skipped_steps;		/* non-finite steps skipped in this job */
	struct sl_moe_dist md;		/* expert group (parallel.expert, capacity_factor) */
	bool have_md;
	int C;				/* parallel.context: ranks sharing each micro-batch */
	struct sl_cp cp;		/* C > 1: this rank's part of the rows (context.h) */
};

/* Every rank passes its verdict; all get true only if every rank's was true. */
static inline bool all_ok(bool ok)
{
	int mine = ok, all = 0;

	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	return all;
}

/* train.c */
void train_format_duration(double s, char *buf, size_t n);

/* train_run.c */
int train_prepare_run_dir(const struct sl_config *c, bool fresh, char *ckpt_dir, size_t n);
int train_write_checkpoint(struct job *j, int step);
int train_resume_from(struct job *j, const char *dir);
int train_export_final(struct job *j);

/* train_batch.c */
void dev_batch_alloc(struct sl_backend *be, struct dev_batch *d, int max_B, int max_L);
void dev_batch_free(struct sl_backend *be, struct dev_batch *d);
const struct sl_batch_dev *dev_batch_upload(struct sl_backend *be, struct dev_batch *d,
					    const struct sl_host_batch *hb);
int dev_batch_targets(struct sl_backend *be, struct dev_batch *d, const struct sl_host_batch *hb);

/* train_eval.c */
void train_run_eval(struct job *j, int step, int32_t pad);

/* train_step.c */
int train_run_steps(struct job *j);

/* train_backend.c */
void train_gpu_reset_peak(struct job *j);
double train_gpu_peak(struct job *j);
void train_gpu_reserved(struct job *j, double *reserved, double *used);
void *train_gpu_stream(struct job *j);
double train_gpu_memory(struct job *j);
int train_create_backend(struct job *j);
void train_start_gpu_log(struct job *j);

#endif
