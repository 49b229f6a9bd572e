/*
 * config_impl.h: what the config module's files share: config.c (the key table, lookups and
 * suggestions), config_value.c (errors; one YAML value into one key), config_load.c (files,
 * includes, --set, validation, sl_config_load) and config_print.c (the printed table, the YAML
 * writer, the diff).  Nothing outside the config module includes it.
 */
#ifndef SL_CONFIG_IMPL_H
#define SL_CONFIG_IMPL_H

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config.h"

enum key_type { K_STR, K_INT, K_LONG, K_DBL, K_BOOL, K_ENUM, K_PAIR };

struct enum_val {
	const char *name;
	int val;
};

struct key_def {
	const char *key;		/* "train.batch"; top-level keys have no dot */
	enum key_type type;
	size_t off;			/* in struct sl_config */
	size_t size;			/* of the field (strings: buffer size) */
	const char *def;		/* default, as YAML text */
	double lo, hi;			/* numbers (each element of a pair): allowed range */
	bool lo_open, hi_open;		/* lo < x instead of lo <= x; x < hi instead of x <= hi */
	const struct enum_val *vals;	/* K_ENUM: allowed names, NULL-terminated */
	bool required;			/* for a training run */
};

/*
 * The key table, in config.c.  MAX_KEYS bounds it only so that struct load_ctx can hold one
 * location per key; config.c checks that the table fits.
 */
#define MAX_KEYS 128
extern const struct key_def cfg_keys[];
extern const int cfg_nkeys;
#define NKEYS cfg_nkeys

/* Where a value came from: "FILE:LINE:COL", or just "FILE" / "--set k=v" when line is 0. */
struct loc {
	const char *file;
	int line, col;		/* 1-based */
};

struct incl {
	const char *shown;	/* the path as resolved, for messages */
	char *real;		/* realpath(), to recognize a cycle */
};

#define MAX_INCLUDE_DEPTH 32
#define MAX_ERRORS 20

struct load_ctx {
	struct sl_config *cfg;
	FILE *err;
	int nerr;
	struct loc set_at[MAX_KEYS];	/* where each key was last set; file NULL = default */
	char **names;			/* owned copies of file names that locations point into */
	int nnames;
	struct incl stack[MAX_INCLUDE_DEPTH];
	int depth;
};

/* -------------------------------------------------------------------------------------------- */
/* small helpers of every file */

static inline const char *leaf_of(const char *key)
{
	const char *dot = strchr(key, '.');

	return dot ? dot + 1 : key;
}

/* length of the section part of "sec.leaf" (0 for a top-level key) */
static inline size_t section_len(const char *key)
{
	const char *dot = strchr(key, '.');

	return dot ? (size_t)(dot - key) : 0;
}

static inline void *field(const struct sl_config *cfg, const struct key_def *k)
{
	return (char *)cfg + k->off;
}

/*
 * The position of @node in the file @base names.  A --set option (line -1) is its own location:
 * positions inside the option's text would mean nothing to the user.
 */
static inline struct loc node_loc(const struct loc *base, const yaml_node_t *node)
{
	struct loc l = { base->file, 0, 0 };

	if (base->line < 0 || !node)
		return l;
	l.line = (int)node->start_mark.line + 1;
	l.col = (int)node->start_mark.column + 1;
	return l;
}

static inline bool is_null_scalar(const yaml_node_t *n)
{
	const char *s = (const char *)n->data.scalar.value;

	if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return false;
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

static inline const char *node_kind(const yaml_node_t *n)
{
	switch (n->type) {
	case YAML_MAPPING_NODE:
		return "a mapping";
	case YAML_SEQUENCE_NODE:
		return "a list";
	default:
		return "nothing";
	}
}

/* @s as a double; false when it is not a whole finite number */
static inline bool parse_double(const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	return *s && !isspace((unsigned char)*s) && !*end && !errno && isfinite(*out);
}

static inline bool parse_bool(const char *s, bool *out)
{
	static const char *const t[] = { "true", "yes", "on" }, *const f[] = { "false", "no", "off" };

	for (int i = 0; i < 3; i++) {
		if (!strcasecmp(s, t[i]))
			return *out = true, true;
		if (!strcasecmp(s, f[i]))
			return *out = false, true;
	}
	return false;
}

/* config.c: the table */
const struct key_def *cfg_find_key(const char *key);
bool cfg_is_section(const char *name);
/* the closest known key (or section) to @typed, or NULL */
const char *cfg_suggest(const char *typed);
void cfg_list_names(const char *sec, char *buf, size_t n);

/* config_value.c: errors and values */
void __attribute__((format(printf, 4, 5)))
cfg_err(struct load_ctx *lc, const struct loc *at, const char *key, const char *fmt, ...);
int cfg_set_value(struct load_ctx *lc, const struct key_def *k, yaml_document_t *doc,
		  yaml_node_t *node, const struct loc *base);
int cfg_set_from_text(struct load_ctx *lc, const struct key_def *k, const char *text,
		      const struct loc *base);

#endif
