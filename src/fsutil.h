/*
 * fsutil: the few file-system helpers several modules share.
 */
#ifndef SL_FSUTIL_H
#define SL_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>

bool sl_is_dir(const char *path);
bool sl_is_file(const char *path);
/* mkdir -p; errors through sl_error */
int sl_mkdir_p(const char *path);
int sl_copy_file(const char *from, const char *to);
/* @path moved aside to the first free @path.old-N (never deleted); the new name in @aside */
int sl_move_aside(const char *path, char *aside, size_t n);

#endif
