/*
 * modelio: a model's files in and out of a job.
 *
 * Opens a Hugging Face model (dir or HF cache: config.json, layout), loads its weights into the
 * rank's shards one unit at a time (so no rank ever holds the whole model in host memory), and
 * writes the Hugging Face export (config.json, safetensors shards and their index, tokenizer
 * files), each writing rank writing its own safetensors file.  Glue between safetensors, model
 * and shard; no numerics.
 */
#ifndef SL_MODELIO_H
#define SL_MODELIO_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "shard.h"

struct sl_model_files {
	char dir[SL_PATH_MAX];		/* resolved model dir (holds config.json) */
	struct sl_model_config mc;
	struct sl_layout lay;
	int task;			/* config.h's enum sl_task: which head the layout has */
	bool have_mc, have_lay;
};

/* @task: 0 classify (score.weight), 1 sft (lm_head.weight unless tied) */
int sl_model_files_open(struct sl_model_files *f, const char *path, const char *revision,
			int task);
void sl_model_files_close(struct sl_model_files *f);

/*
 * Every unit's weights into @sh (this rank's slices); the head is initialized when the checkpoint
 * has none (logged).  *n_initialized: tensors initialized.
 */
int sl_model_files_load_shard(struct sl_model_files *f, struct sl_shard *sh, uint64_t seed,
			      int *n_initialized);

/*
 * The Hugging Face export at @out_dir, written through @out_dir.tmp and renamed when complete.
 * Collective over @comm: its rank k writes file k of n = min(comm size, units) holding the
 * units u with u % n == k, whose whole master weights are in units[u] (host, NULL elsewhere);
 * rank 0 writes config.json, the index (n > 1) and copies the tokenizer files.
 */
int sl_model_export(const char *out_dir, const struct sl_model_files *f, float *const *units,
		    enum sl_precision dtype, MPI_Comm comm);

/* Gather the whole units this rank exports (u % n == shard rank) from the shard group. */
int sl_model_gather_for_export(struct sl_shard *sh, int n_files, float ***units_out);
void sl_model_free_units(float **units, int n_units);

#endif
