/*
 * ckpt: HDF5 checkpoints (DESIGN.md §3 "HDF5 checkpoint").
 *
 * RUN/checkpoints/step-NNNNNN/ holds rank-RRRRR.h5 per writing rank (its shard of every unit:
 * fp32 master weights and, unless weights-only, AdamW moments; attributes: step, world, shard
 * geometry, seed, data cursor, a checksum per dataset), index.h5 (rank 0: every parameter under
 * its HF name and true shape as a virtual dataset over the rank files, /master/<name> and, with
 * the optimizer, /m/<name> and /v/<name>; the resolved config as an attribute) and COMPLETE,
 * written last after every file is fsync'ed.  Loading verifies every rank file first, then reads
 * this rank's ranges through the index, so any world size can read any checkpoint.
 * Knows tensor names, shapes and shard maps, not how the model computes.
 */
#ifndef SL_CKPT_H
#define SL_CKPT_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/*
 * Shard geometry: every unit u of the layout is a flat buffer of lay->unit_numel[u] elements; the
 * rank with index shard_rank in its shard group holds shard[u] of them (the same number on every
 * rank of the group), elements [start[u], start[u] + count[u]) of the unit and count[u] <=
 * shard[u] (the rest padding).  Without start/count: start = shard_rank * shard[u], count up to
 * the unit's end (the even split; an experts' unit split over expert groups is not).  The shard
 * group's ranges are disjoint and cover every unit.
 */
struct sl_ckpt_geom {
	const struct sl_layout *lay;
	int shard_size;			/* ranks in a shard group */
	int shard_rank;			/* this rank's index in its shard group */
	bool writer;			/* this rank writes a file (first replica) */
	int world;
	int rank;			/* world rank */
	const size_t *shard;		/* (n_units) elements per rank of each unit */
	const size_t *start;		/* (n_units) or NULL, as above */
	const size_t *count;		/* (n_units) or NULL */
};

struct sl_ckpt_state {
	int step;			/* optimizer steps done */
	uint64_t seed;
	int64_t data_cursor;		/* records consumed (step * records per step) */
	const char *config_yaml;	/* written as an attribute of index.h5 */
};

/*
 * Write step-NNNNNN under @root.  master/m/v: per unit, this rank's shard (host, shard[u] floats);
 * m and v may be NULL with @optimizer false.  Collective over @world (MPI_COMM_WORLD).
 * *bytes / *seconds: total size and wall time (rank 0).  0 or negative (the previous complete
 * checkpoint is untouched on failure).  Then removes complete checkpoints beyond the newest @keep.
 * Non-writer ranks (HSDP replicas) pass their buffers or NULL; they only take part in the
 * agreement.  Failure is agreed: every rank returns negative, the new step directory is removed.
 * A step directory that is already complete is never overwritten (an error); an incomplete one
 * (a crashed write) is cleared and reused.  keep <= 0 keeps every complete checkpoint; incomplete
 * leftovers older than the newest complete checkpoint are removed either way.
 */
int sl_ckpt_write(const char *root, const struct sl_ckpt_geom *g, const struct sl_ckpt_state *s,
		  float *const *master, float *const *m, float *const *v, bool optimizer, int keep,
		  MPI_Comm world, double *bytes, double *seconds);

/* The newest complete checkpoint under @root: its dir in @dir, 1 if found, 0 if none, <0 error. */
int sl_ckpt_find_latest(const char *root, char *dir, size_t n, int *step);

/*
 * Read checkpoint @dir into this rank's shards (any world size: ranges through the index).
 * Verifies every rank file (present, readable, checksums) before reading anything; errors name
 * the file.  m/v may be NULL to skip them (then they need not be in the checkpoint).
 * s->config_yaml is set to a malloc'ed copy of the stored config (caller frees).
 */
int sl_ckpt_read(const char *dir, const struct sl_ckpt_geom *g, struct sl_ckpt_state *s,
		 float **master, float **m, float **v, MPI_Comm world);

/* 1 if checkpoint @dir holds AdamW moments (m/v may be read), 0 if weights only, <0 error.
 * Not collective: one rank may ask and broadcast. */
int sl_ckpt_has_optimizer(const char *dir);

/*
 * Before training (one rank): @root (created if missing) is writable and its file system has
 * room for @keep + 1 checkpoints of @bytes_each (those already complete there counted); else an
 * error naming what is free and needed, with what to change.  0 or negative.
 */
int sl_ckpt_check_space(const char *root, double bytes_each, int keep);

/* The resolved config stored in @dir's index.h5 (malloc'ed YAML), NULL after an error. */
char *sl_ckpt_read_config(const char *dir);

#endif
