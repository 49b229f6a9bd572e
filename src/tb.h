/*
 * tb: TensorBoard event files, so `tensorboard --logdir runs` shows runs while they train.
 *
 * One file RUN/tb/events.out.tfevents.<unix seconds>.<host> per training process that logs (rank
 * 0), of TFRecord records (length, masked CRC32C of the length, an Event protobuf, masked CRC32C
 * of it); the first Event carries file_version "brain.Event:2", every other one a scalar.
 */
#ifndef SL_TB_H
#define SL_TB_H

#include <stddef.h>
#include <stdint.h>

struct sl_tb;

/* Make @dir (and its parents) and a new event file in it.  NULL after sl_error() on failure. */
struct sl_tb *sl_tb_open(const char *dir);

/* Append the scalar @tag (e.g. "train/loss") at @step.  0, or -1 after sl_error(). */
int sl_tb_scalar(struct sl_tb *tb, const char *tag, long long step, double value);

/* Push what was appended to the file (TensorBoard reads it while the run goes on).  0 or -1. */
int sl_tb_flush(struct sl_tb *tb);

/* Flush and close; NULL is fine. */
void sl_tb_close(struct sl_tb *tb);

/* The event file's path. */
const char *sl_tb_path(const struct sl_tb *tb);

/* CRC-32C (Castagnoli), as TFRecord uses it, unmasked. */
uint32_t sl_crc32c(const void *data, size_t n);

#endif
