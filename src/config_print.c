/*
 * config_print.c: a resolved config as text: one value (sl_config_format), the two-column table,
 * YAML that sl_config_load reads back to the same struct, the first key in which two configs
 * differ (sl_config_diff, for resumes), and the names of enum values for logs.
 */
#include "config_impl.h"

/* shortest text that reads back as the same double; always with a '.' or exponent */
static void format_double(double v, char *buf, size_t n)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	if (!strpbrk(buf, ".eEn"))
		strncat(buf, ".0", n - strlen(buf) - 1);
}

static const char *enum_name(const struct key_def *k, int v)
{
	for (int i = 0; k->vals[i].name; i++)
		if (k->vals[i].val == v)
			return k->vals[i].name;
	return "?";
}

static void format_value(const struct sl_config *cfg, const struct key_def *k, char *buf,
			 size_t n)
{
	const void *f = field(cfg, k);

	switch (k->type) {
	case K_STR:
		snprintf(buf, n, "%s", (const char *)f);
		break;
	case K_INT:
		snprintf(buf, n, "%d", *(const int *)f);
		break;
	case K_LONG:
		snprintf(buf, n, "%ld", *(const long *)f);
		break;
	case K_DBL:
		format_double(*(const double *)f, buf, n);
		break;
	case K_BOOL:
		snprintf(buf, n, "%s", *(const bool *)f ? "true" : "false");
		break;
	case K_ENUM:
		snprintf(buf, n, "%s", enum_name(k, *(const int *)f));
		break;
	case K_PAIR: {
		char a[32], b[32];

		format_double(((const double *)f)[0], a, sizeof(a));
		format_double(((const double *)f)[1], b, sizeof(b));
		snprintf(buf, n, "[%s, %s]", a, b);
		break;
	}
	}
}

int sl_config_format(const struct sl_config *cfg, const char *key, char *buf, size_t n)
{
	const struct key_def *k = cfg_find_key(key);

	if (!k)
		return -ENOENT;
	format_value(cfg, k, buf, n);
	return 0;
}

void sl_config_print_table(const struct sl_config *cfg, FILE *out)
{
	char val[SL_PATH_MAX + 8];
	int width = 0;

	for (int i = 0; i < NKEYS; i++)
		if ((int)strlen(cfg_keys[i].key) > width)
			width = (int)strlen(cfg_keys[i].key);
	for (int i = 0; i < NKEYS; i++) {
		format_value(cfg, &cfg_keys[i], val, sizeof(val));
		/* an empty string would look like a missing column */
		fprintf(out, "%-*s  %s\n", width, cfg_keys[i].key, val[0] ? val : "\"\"");
	}
}

/* Would a YAML reader take @s as something other than a string when written plain? */
static bool needs_quotes(const char *s)
{
	double d;
	bool b;

	return !*s || parse_double(s, &d) || parse_bool(s, &b) || !strcmp(s, "~") ||
	       !strcasecmp(s, "null") || !strcmp(s, "y") || !strcmp(s, "n") ||
	       !strcmp(s, ".inf") || !strcmp(s, ".nan");
}

static int emit(yaml_emitter_t *em, yaml_event_t *ev, int ok)
{
	if (!ok)
		return -ENOMEM;
	return yaml_emitter_emit(em, ev) ? 0 : -EIO;
}

static int emit_scalar(yaml_emitter_t *em, const char *s, yaml_scalar_style_t style)
{
	yaml_event_t ev;

	return emit(em, &ev, yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s,
							  (int)strlen(s), 1, 1, style));
}

int sl_config_write_yaml(const struct sl_config *cfg, FILE *out)
{
	yaml_emitter_t em;
	yaml_event_t ev;
	char val[SL_PATH_MAX + 8];
	size_t open_sec = 0;	/* length of the section whose mapping is open, 0 = none */
	const char *sec = NULL;
	int rc;

	fprintf(out, "# resolved config%s%s (written by shardlm; every key)\n",
		cfg->source[0] ? " of " : "", cfg->source);
	if (!yaml_emitter_initialize(&em))
		return -ENOMEM;
	yaml_emitter_set_output_file(&em, out);
	yaml_emitter_set_width(&em, -1);
	yaml_emitter_set_unicode(&em, 1);

	rc = emit(&em, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
	if (!rc)
		rc = emit(&em, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
	if (!rc)
		rc = emit(&em, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
									YAML_BLOCK_MAPPING_STYLE));
	for (int i = 0; !rc && i < NKEYS; i++) {
		const struct key_def *k = &cfg_keys[i];
		size_t slen = section_len(k->key);

		if (open_sec && (slen != open_sec || strncmp(k->key, sec, slen))) {
			rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
			open_sec = 0;
		}
		if (!rc && slen && !open_sec) {
			char name[64];

			snprintf(name, sizeof(name), "%.*s", (int)slen, k->key);
			rc = emit_scalar(&em, name, YAML_PLAIN_SCALAR_STYLE);
			if (!rc)
				rc = emit(&em, &ev, yaml_mapping_start_event_initialize(&ev, NULL,
						NULL, 1, YAML_BLOCK_MAPPING_STYLE));
			open_sec = slen;
			sec = k->key;
		}
		if (!rc)
			rc = emit_scalar(&em, leaf_of(k->key), YAML_PLAIN_SCALAR_STYLE);
		if (rc)
			break;
		if (k->type == K_PAIR) {
			const double *v = field(cfg, k);

			rc = emit(&em, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
						YAML_FLOW_SEQUENCE_STYLE));
			for (int j = 0; !rc && j < 2; j++) {
				format_double(v[j], val, sizeof(val));
				rc = emit_scalar(&em, val, YAML_PLAIN_SCALAR_STYLE);
			}
			if (!rc)
				rc = emit(&em, &ev, yaml_sequence_end_event_initialize(&ev));
			continue;
		}
		format_value(cfg, k, val, sizeof(val));
		rc = emit_scalar(&em, val, k->type == K_STR && needs_quotes(val) ?
				 YAML_DOUBLE_QUOTED_SCALAR_STYLE : k->type == K_STR ?
				 YAML_ANY_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE);
	}
	if (!rc && open_sec)
		rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
	if (!rc)
		rc = emit(&em, &ev, yaml_mapping_end_event_initialize(&ev));
	if (!rc)
		rc = emit(&em, &ev, yaml_document_end_event_initialize(&ev, 1));
	if (!rc)
		rc = emit(&em, &ev, yaml_stream_end_event_initialize(&ev));
	if (!rc && !yaml_emitter_flush(&em))
		rc = -EIO;
	yaml_emitter_delete(&em);
	if (!rc && ferror(out))
		rc = -EIO;
	return rc;
}

static bool ignored(const char *key, const char *const *ignore)
{
	for (int i = 0; ignore && ignore[i]; i++) {
		size_t n = strlen(ignore[i]);

		if (n && ignore[i][n - 1] == '.' ? !strncmp(key, ignore[i], n) :
		    !strcmp(key, ignore[i]))
			return true;
	}
	return false;
}

int sl_config_diff_ignoring(const struct sl_config *a, const struct sl_config *b,
			    const char *const *ignore, char *key, size_t n)
{
	for (int i = 0; i < NKEYS; i++) {
		const struct key_def *k = &cfg_keys[i];
		const void *fa = field(a, k), *fb = field(b, k);
		bool same;

		if (ignored(k->key, ignore))
			continue;
		switch (k->type) {
		case K_STR:
			same = !strcmp(fa, fb);
			break;
		case K_DBL:
			same = *(const double *)fa == *(const double *)fb;
			break;
		case K_PAIR:
			same = ((const double *)fa)[0] == ((const double *)fb)[0] &&
			       ((const double *)fa)[1] == ((const double *)fb)[1];
			break;
		default:	/* integers, bools, enums: the bytes are the value */
			same = !memcmp(fa, fb, k->size);
			break;
		}
		if (!same) {
			if (key && n)
				snprintf(key, n, "%s", k->key);
			return 1;
		}
	}
	if (key && n)
		key[0] = '\0';
	return 0;
}

int sl_config_diff(const struct sl_config *a, const struct sl_config *b, char *key, size_t n)
{
	return sl_config_diff_ignoring(a, b, NULL, key, n);
}

const char *sl_task_name(enum sl_task t)
{
	return enum_name(cfg_find_key("task"), t);
}

const char *sl_precision_name(enum sl_precision p)
{
	return enum_name(cfg_find_key("precision.compute"), p);
}

const char *sl_backend_name(enum sl_backend_kind b)
{
	return enum_name(cfg_find_key("backend"), b);
}

const char *sl_schedule_name(enum sl_schedule s)
{
	return enum_name(cfg_find_key("optim.schedule"), s);
}

const char *sl_offload_name(enum sl_offload o)
{
	return enum_name(cfg_find_key("parallel.offload"), o);
}
