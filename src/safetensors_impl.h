/*
 * safetensors_impl.h: what the files of the safetensors module share (safetensors.c,
 * safetensors_resolve.c, safetensors_convert.c, safetensors_load.c, safetensors_write.c).
 * Nothing outside the module includes it.
 */
#ifndef SL_SAFETENSORS_IMPL_H
#define SL_SAFETENSORS_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

/* Tensor data is read and written in place: the format is little-endian, and so must the host be. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors assumes a little-endian host"
#endif

/* small helpers (safetensors.c) */
bool st_is_file(const char *p);
/* @a/@b into @out; refuses to truncate */
int st_join(char *out, size_t n, const char *a, const char *b);
void st_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

#endif
