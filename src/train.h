/*
 * train: the commands that run a model: `train`, `score` and `config` (argument parsing, the run
 * directory, the step loop, evaluation, the final export).  It ties the modules together in the
 * order data flows (config -> data -> model over a backend -> shard -> optim -> metrics) and holds
 * no numerics of its own.
 */
#ifndef SL_TRAIN_H
#define SL_TRAIN_H

int sl_cmd_train(int argc, char **argv);
int sl_cmd_score(int argc, char **argv);
int sl_cmd_config(int argc, char **argv);

#endif
