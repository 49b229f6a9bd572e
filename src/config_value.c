/*
 * config_value.c: errors, and one YAML value into one key.
 *
 * cfg_err() prints "FILE:LINE:COL: key: what is wrong" and counts, so that loading can go on
 * after a bad key (up to MAX_ERRORS); cfg_set_value() checks a YAML node against its key's type
 * and range and stores it in struct sl_config; cfg_set_from_text() reads --set values and the
 * table's defaults as YAML text, so they mean what the same text means in a file.
 */
#include "config_impl.h"

#include <limits.h>
#include <stdarg.h>

/* -------------------------------------------------------------------------------------------- */
/* errors */

void __attribute__((format(printf, 4, 5)))
cfg_err(struct load_ctx *lc, const struct loc *at, const char *key, const char *fmt, ...)
{
	va_list ap;

	lc->nerr++;
	if (lc->nerr > MAX_ERRORS)
		return;
	if (at->line > 0)
		fprintf(lc->err, "%s:%d:%d: ", at->file, at->line, at->col);
	else
		fprintf(lc->err, "%s: ", at->file);
	if (key)
		fprintf(lc->err, "%s: ", key);
	va_start(ap, fmt);
	vfprintf(lc->err, fmt, ap);
	va_end(ap);
	fputc('\n', lc->err);
	if (lc->nerr == MAX_ERRORS)
		fprintf(lc->err, "%s: too many errors; stopping here\n", at->file);
}

/* -------------------------------------------------------------------------------------------- */
/* a key's type and range in words, for the messages */

static void enum_names(const struct enum_val *v, char *buf, size_t n)
{
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; v[i].name && used < n; i++)
		used += snprintf(buf + used, n - used, "%s%s", i ? "|" : "", v[i].name);
}

static const char *type_desc(const struct key_def *k, char *buf, size_t n)
{
	switch (k->type) {
	case K_STR:
		return "a string";
	case K_INT:
	case K_LONG:
		return "an integer";
	case K_DBL:
		return "a number";
	case K_BOOL:
		return "true or false";
	case K_PAIR:
		return "a list of 2 numbers like [0.9, 0.95]";
	case K_ENUM: {
		char names[128];

		enum_names(k->vals, names, sizeof(names));
		snprintf(buf, n, "one of %s", names);
		return buf;
	}
	}
	return "?";
}

static void range_desc(const struct key_def *k, char *buf, size_t n)
{
	if (isinf(k->hi))
		snprintf(buf, n, "must be %s %g", k->lo_open ? ">" : ">=", k->lo);
	else
		snprintf(buf, n, "must be in %c%g, %g%c", k->lo_open ? '(' : '[', k->lo, k->hi,
			 k->hi_open ? ')' : ']');
}

static bool in_range(const struct key_def *k, double v)
{
	if (k->lo_open ? !(v > k->lo) : !(v >= k->lo))
		return false;
	if (k->hi_open ? !(v < k->hi) : !(v <= k->hi))
		return false;
	return true;
}

/* -------------------------------------------------------------------------------------------- */
/* values */

static int check_range(struct load_ctx *lc, const struct key_def *k, const struct loc *at,
		       double v, const char *text)
{
	char desc[96];

	if (in_range(k, v))
		return 0;
	range_desc(k, desc, sizeof(desc));
	cfg_err(lc, at, k->key, "%s, got %s", desc, text);
	return -EINVAL;
}

/*
 * Store the YAML @node as the value of @k.  @base is the file (line 0) or the --set option
 * (line -1, which every message then names instead of a position).
 */
int cfg_set_value(struct load_ctx *lc, const struct key_def *k, yaml_document_t *doc,
		     yaml_node_t *node, const struct loc *base)
{
	struct loc at = node_loc(base, node);
	void *f = field(lc->cfg, k);
	char desc[160];
	const char *s;

	if (k->type == K_PAIR) {
		double v[2];
		yaml_node_item_t *it;

		if (node->type != YAML_SEQUENCE_NODE ||
		    node->data.sequence.items.top - node->data.sequence.items.start != 2) {
			cfg_err(lc, &at, k->key, "expected %s, got %s", type_desc(k, desc, sizeof(desc)),
				node->type == YAML_SCALAR_NODE ?
				(is_null_scalar(node) ? "nothing" : "a single value") :
				node->type == YAML_SEQUENCE_NODE ? "a list of another length" :
				node_kind(node));
			return -EINVAL;
		}
		it = node->data.sequence.items.start;
		for (int i = 0; i < 2; i++) {
			yaml_node_t *e = yaml_document_get_node(doc, it[i]);
			struct loc eat = node_loc(base, e);

			if (e->type != YAML_SCALAR_NODE ||
			    !parse_double((const char *)e->data.scalar.value, &v[i])) {
				cfg_err(lc, &eat, k->key, "element %d: expected a number, got %s%s%s",
					i + 1, e->type == YAML_SCALAR_NODE ? "'" : "",
					e->type == YAML_SCALAR_NODE ?
					(const char *)e->data.scalar.value : node_kind(e),
					e->type == YAML_SCALAR_NODE ? "'" : "");
				return -EINVAL;
			}
			if (check_range(lc, k, &eat, v[i], (const char *)e->data.scalar.value))
				return -EINVAL;
		}
		memcpy(f, v, sizeof(v));
		return 0;
	}

	if (node->type != YAML_SCALAR_NODE) {
		cfg_err(lc, &at, k->key, "expected %s, got %s", type_desc(k, desc, sizeof(desc)),
			node_kind(node));
		return -EINVAL;
	}
	s = (const char *)node->data.scalar.value;

	if (k->type == K_STR) {
		if (is_null_scalar(node))
			s = "";
		if (strlen(s) != node->data.scalar.length) {
			cfg_err(lc, &at, k->key, "the value contains a NUL character");
			return -EINVAL;
		}
		if (strlen(s) >= k->size) {
			cfg_err(lc, &at, k->key, "value too long (%zu bytes, at most %zu)",
				strlen(s), k->size - 1);
			return -EINVAL;
		}
		memcpy(f, s, strlen(s) + 1);
		return 0;
	}
	if (is_null_scalar(node)) {
		cfg_err(lc, &at, k->key, "expected %s, got nothing", type_desc(k, desc, sizeof(desc)));
		return -EINVAL;
	}

	switch (k->type) {
	case K_INT:
	case K_LONG: {
		char *end;
		long long v;

		errno = 0;
		v = strtoll(s, &end, 10);
		if (!*s || isspace((unsigned char)*s) || *end) {
			cfg_err(lc, &at, k->key, "expected an integer, got '%s'", s);
			return -EINVAL;
		}
		if (errno == ERANGE || (k->type == K_INT && (v < INT_MIN || v > INT_MAX)) ||
		    (k->type == K_LONG && (v < LONG_MIN || v > LONG_MAX))) {
			cfg_err(lc, &at, k->key, "%s does not fit in a %d-bit integer", s,
				k->type == K_INT ? 32 : (int)sizeof(long) * 8);
			return -EINVAL;
		}
		if (check_range(lc, k, &at, (double)v, s))
			return -EINVAL;
		if (k->type == K_INT)
			*(int *)f = (int)v;
		else
			*(long *)f = (long)v;
		return 0;
	}
	case K_DBL: {
		double v;

		if (!parse_double(s, &v)) {
			cfg_err(lc, &at, k->key, "expected a number (like 1e-5 or 0.1), got '%s'", s);
			return -EINVAL;
		}
		if (check_range(lc, k, &at, v, s))
			return -EINVAL;
		*(double *)f = v;
		return 0;
	}
	case K_BOOL:
		if (!parse_bool(s, (bool *)f)) {
			cfg_err(lc, &at, k->key, "expected true or false (or yes/no, on/off), got '%s'",
				s);
			return -EINVAL;
		}
		return 0;
	case K_ENUM:
		for (int i = 0; k->vals[i].name; i++) {
			if (!strcasecmp(s, k->vals[i].name)) {
				*(int *)f = k->vals[i].val;
				return 0;
			}
		}
		cfg_err(lc, &at, k->key, "expected %s, got '%s'", type_desc(k, desc, sizeof(desc)),
			s);
		return -EINVAL;
	default:
		return -EINVAL;
	}
}

/*
 * Parse @text as a one-document YAML value and store it in @k: --set values and the table's
 * defaults take this path, so they read exactly like the same text in a file.
 */
int cfg_set_from_text(struct load_ctx *lc, const struct key_def *k, const char *text,
			 const struct loc *base)
{
	yaml_parser_t parser;
	yaml_document_t doc;
	yaml_node_t *root, empty = { 0 };
	int rc;

	if (!yaml_parser_initialize(&parser))
		return -ENOMEM;
	yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
	if (!yaml_parser_load(&parser, &doc)) {
		/* not YAML (e.g. "a: b" or an unbalanced quote): a string key takes it verbatim */
		if (k->type == K_STR && strlen(text) < k->size) {
			memcpy(field(lc->cfg, k), text, strlen(text) + 1);
			rc = 0;
		} else {
			cfg_err(lc, base, k->key, "cannot read the value as YAML: %s",
				parser.problem ? parser.problem : "syntax error");
			rc = -EINVAL;
		}
		goto out_free_parser;
	}
	root = yaml_document_get_root_node(&doc);
	if (!root) {	/* "key=" : an empty value, as an empty plain scalar is in a file */
		empty.type = YAML_SCALAR_NODE;
		empty.data.scalar.value = (yaml_char_t *)"";
		empty.data.scalar.length = 0;
		empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
		root = &empty;
	}
	if (k->type == K_STR && root->type != YAML_SCALAR_NODE && strlen(text) < k->size) {
		memcpy(field(lc->cfg, k), text, strlen(text) + 1);
		rc = 0;
		goto out_free_doc;
	}
	rc = cfg_set_value(lc, k, &doc, root, base);
out_free_doc:
	yaml_document_delete(&doc);
out_free_parser:
	yaml_parser_delete(&parser);
	return rc;
}
