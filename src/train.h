/*
 * train: the commands that run a model: `train` (train.c, its parts in train_*.c), `config`
 * (train_cmd.c), `score` and `export` (score.c).  They tie the modules together in the order data
 * flows (config -> data -> model over a backend -> shard -> optim -> ckpt/metrics) and hold no
 * numerics of their own.
 */
#ifndef SL_TRAIN_H
#define SL_TRAIN_H

#include <stdbool.h>

#include "config.h"

int sl_cmd_train(int argc, char **argv);
int sl_cmd_score(int argc, char **argv);
int sl_cmd_export(int argc, char **argv);
int sl_cmd_config(int argc, char **argv);

/* shared by the commands (train_cmd.c) */
#define SL_MAX_SET 256
struct sl_cmd_args {
	const char *config;		/* train, score, config */
	char *set[SL_MAX_SET];
	int nset;
	bool fresh;			/* train */
	const char *data;		/* score */
	const char *model;		/* score */
	const char *checkpoint;		/* export */
	const char *out;		/* export */
};
/* argv[0] is the subcommand; 0 ok, 1 help printed, -1 error (printed) */
int sl_cmd_parse(const char *cmd, int argc, char **argv, struct sl_cmd_args *a);
/* Settings this version cannot honour yet are refused rather than ignored. */
int sl_check_supported(const struct sl_config *c, bool training);
/* The checkpoint root of a run: checkpoint.dir, relative to run.dir unless absolute. */
void sl_checkpoint_root(const struct sl_config *c, char *buf, size_t n);

#endif
