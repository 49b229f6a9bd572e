/*
 * config_load.c: YAML files and --set options into struct sl_config: sl_config_defaults,
 * sl_config_load and sl_config_load_err.
 *
 * A file's includes are read before its own keys, so the file that names them wins; --set
 * options apply last, in order.  Where each key was last set is kept (load_ctx.set_at) so that
 * validate(), the checks of more than one key, can point at it.
 */
#include "config_impl.h"

/* -------------------------------------------------------------------------------------------- */
/* files */

/*
 * libyaml resolves an alias (*name) to the anchored node itself, so a node with two parents is
 * an alias.  A config has no use for them, and refusing them keeps any walk of the document
 * linear in the file's size (no "billion laughs").
 */
static int refuse_aliases(struct load_ctx *lc, yaml_document_t *doc, const struct loc *file)
{
	size_t n = doc->nodes.top - doc->nodes.start;
	unsigned char *refs = calloc(n + 1, 1);
	int rc = 0;

	if (!refs)
		return -ENOMEM;
	for (yaml_node_t *nd = doc->nodes.start; nd < doc->nodes.top && !rc; nd++) {
		int kids[2], nk = 0;

		if (nd->type == YAML_SEQUENCE_NODE) {
			for (yaml_node_item_t *it = nd->data.sequence.items.start;
			     it < nd->data.sequence.items.top && !rc; it++)
				if (*it >= 1 && (size_t)*it <= n && refs[*it]++)
					rc = *it;
			continue;
		}
		if (nd->type != YAML_MAPPING_NODE)
			continue;
		for (yaml_node_pair_t *p = nd->data.mapping.pairs.start;
		     p < nd->data.mapping.pairs.top && !rc; p++) {
			kids[0] = p->key;
			kids[1] = p->value;
			for (nk = 0; nk < 2 && !rc; nk++)
				if (kids[nk] >= 1 && (size_t)kids[nk] <= n && refs[kids[nk]]++)
					rc = kids[nk];
		}
	}
	free(refs);
	if (rc) {
		struct loc at = node_loc(file, yaml_document_get_node(doc, rc));

		cfg_err(lc, &at, NULL, "YAML anchors and aliases (&name, *name) are not supported "
			"in a config: write the value out (or use include:)");
		return -EINVAL;
	}
	return 0;
}

static const char *keep_name(struct load_ctx *lc, const char *name)
{
	char **n = realloc(lc->names, (lc->nnames + 1) * sizeof(*n));

	if (!n)
		return NULL;
	lc->names = n;
	n[lc->nnames] = strdup(name);
	if (!n[lc->nnames])
		return NULL;
	return n[lc->nnames++];
}

static void mark_set(struct load_ctx *lc, const struct key_def *k, const struct loc *at)
{
	lc->set_at[k - cfg_keys] = *at;
}

/* Every mapping's keys must be plain, distinct names. */
static int check_mapping_keys(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *map,
			      const char *sec, const struct loc *file)
{
	yaml_node_pair_t *p0 = map->data.mapping.pairs.start, *end = map->data.mapping.pairs.top;
	int rc = 0;

	for (yaml_node_pair_t *p = p0; p < end; p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		struct loc at = node_loc(file, kn);

		if (kn->type != YAML_SCALAR_NODE) {
			cfg_err(lc, &at, sec, "a key must be a name, got %s", node_kind(kn));
			rc = -EINVAL;
			continue;
		}
		for (yaml_node_pair_t *q = p0; q < p; q++) {
			yaml_node_t *qn = yaml_document_get_node(doc, q->key);
			char full[300];

			if (qn->type != YAML_SCALAR_NODE ||
			    strcmp((char *)qn->data.scalar.value, (char *)kn->data.scalar.value))
				continue;
			snprintf(full, sizeof(full), "%s%s%s", sec ? sec : "", sec ? "." : "",
				 (char *)kn->data.scalar.value);
			cfg_err(lc, &at, full, "duplicate key (first at line %d, column %d); keep one",
				(int)qn->start_mark.line + 1, (int)qn->start_mark.column + 1);
			rc = -EINVAL;
			break;
		}
	}
	return rc;
}

static int load_file(struct load_ctx *lc, const char *path, const struct loc *from);

static int load_includes(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *val,
			 const char *path, const struct loc *file)
{
	yaml_node_item_t *items = NULL;
	int n = 0, rc = 0;
	const char *slash = strrchr(path, '/');
	int dirlen = slash ? (int)(slash - path) + 1 : 0;

	if (val->type == YAML_SCALAR_NODE) {
		if (is_null_scalar(val))
			return 0;
	} else if (val->type == YAML_SEQUENCE_NODE) {
		items = val->data.sequence.items.start;
		n = (int)(val->data.sequence.items.top - items);
	} else {
		struct loc at = node_loc(file, val);

		cfg_err(lc, &at, "include", "expected a file name or a list of them, got %s",
			node_kind(val));
		return -EINVAL;
	}

	for (int i = 0; i < (items ? n : 1); i++) {
		yaml_node_t *e = items ? yaml_document_get_node(doc, items[i]) : val;
		struct loc at = node_loc(file, e);
		const char *name = (const char *)e->data.scalar.value;
		char resolved[SL_PATH_MAX];

		if (e->type != YAML_SCALAR_NODE || is_null_scalar(e)) {
			cfg_err(lc, &at, "include", "expected a file name, got %s",
				e->type == YAML_SCALAR_NODE ? "nothing" : node_kind(e));
			return -EINVAL;
		}
		/* relative to the including file, so a config tree works from any directory */
		if (name[0] == '/')
			rc = snprintf(resolved, sizeof(resolved), "%s", name);
		else
			rc = snprintf(resolved, sizeof(resolved), "%.*s%s", dirlen, path, name);
		if (rc < 0 || rc >= (int)sizeof(resolved)) {
			cfg_err(lc, &at, "include", "path too long");
			return -EINVAL;
		}
		rc = load_file(lc, resolved, &at);
		if (rc)
			return rc;
	}
	return 0;
}

/* Apply the keys of one section mapping ("train: {...}"). */
static int apply_section(struct load_ctx *lc, yaml_document_t *doc, const char *sec,
			 yaml_node_t *map, const struct loc *file)
{
	int rc = 0;

	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		yaml_node_t *vn = yaml_document_get_node(doc, p->value);
		struct loc at = node_loc(file, kn);
		const struct key_def *k;
		const char *hint;
		char full[300];

		if (kn->type != YAML_SCALAR_NODE)
			continue;	/* reported by check_mapping_keys */
		snprintf(full, sizeof(full), "%s.%s", sec, (char *)kn->data.scalar.value);
		k = cfg_find_key(full);
		if (!k) {
			char names[512];

			hint = cfg_suggest(full);
			if (hint) {
				cfg_err(lc, &at, full, "unknown key; did you mean '%s'?", hint);
			} else {
				cfg_list_names(sec, names, sizeof(names));
				cfg_err(lc, &at, full, "unknown key; the keys of '%s' are: %s", sec,
					names);
			}
			rc = -EINVAL;
			continue;
		}
		if (cfg_set_value(lc, k, doc, vn, file)) {
			rc = -EINVAL;
			continue;
		}
		mark_set(lc, k, &at);
	}
	return rc;
}

static int apply_top(struct load_ctx *lc, yaml_document_t *doc, yaml_node_t *root,
		     const struct loc *file)
{
	int rc = 0;

	for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
	     p < root->data.mapping.pairs.top; p++) {
		yaml_node_t *kn = yaml_document_get_node(doc, p->key);
		yaml_node_t *vn = yaml_document_get_node(doc, p->value);
		struct loc at = node_loc(file, kn);
		const char *name;
		const struct key_def *k;

		if (kn->type != YAML_SCALAR_NODE)
			continue;	/* reported by check_mapping_keys */
		name = (const char *)kn->data.scalar.value;
		if (!strcmp(name, "include"))
			continue;	/* merged already */
		if (cfg_is_section(name)) {
			if (vn->type == YAML_MAPPING_NODE) {
				if (check_mapping_keys(lc, doc, vn, name, file) ||
				    apply_section(lc, doc, name, vn, file))
					rc = -EINVAL;
			} else if (vn->type != YAML_SCALAR_NODE || !is_null_scalar(vn)) {
				struct loc vat = node_loc(file, vn);
				char names[512];

				cfg_list_names(name, names, sizeof(names));
				cfg_err(lc, &vat, name, "expected a mapping of %s's keys (%s), got "
					"%s%s%s", name, names, vn->type == YAML_SCALAR_NODE ? "'" : "",
					vn->type == YAML_SCALAR_NODE ?
					(char *)vn->data.scalar.value : node_kind(vn),
					vn->type == YAML_SCALAR_NODE ? "'" : "");
				rc = -EINVAL;
			}
			continue;
		}
		k = cfg_find_key(name);
		if (k && !section_len(k->key)) {
			if (cfg_set_value(lc, k, doc, vn, file))
				rc = -EINVAL;
			else
				mark_set(lc, k, &at);
			continue;
		}
		if (k) {
			cfg_err(lc, &at, name, "dotted keys are for --set; in a file write "
				"'%.*s: {%s: ...}'", (int)section_len(name), name, leaf_of(name));
		} else {
			const char *hint = cfg_suggest(name);
			char names[512];

			if (hint) {
				cfg_err(lc, &at, name, "unknown section; did you mean '%s'?", hint);
			} else {
				cfg_list_names(NULL, names, sizeof(names));
				cfg_err(lc, &at, name, "unknown section; the top-level names are: %s",
					names);
			}
		}
		rc = -EINVAL;
	}
	return rc;
}

/*
 * Read @path into lc->cfg: its includes first, then its own keys.  @from: the include entry that
 * named it (NULL for the top-level file), which is where "cannot open" is reported.
 */
static int load_file(struct load_ctx *lc, const char *path, const struct loc *from)
{
	yaml_parser_t parser;
	yaml_document_t doc, extra;
	yaml_node_t *root;
	struct loc file;
	char *real = NULL;
	FILE *fp;
	int rc = 0;

	file.file = keep_name(lc, path);
	file.line = file.col = 0;
	if (!file.file)
		return -ENOMEM;

	fp = fopen(path, "r");
	if (!fp) {
		int e = errno;

		if (from)
			cfg_err(lc, from, "include", "cannot open '%s': %s", path, strerror(e));
		else
			cfg_err(lc, &file, NULL, "cannot open the config file: %s", strerror(e));
		return e == ENOENT ? -ENOENT : -EIO;
	}
	real = realpath(path, NULL);
	if (!real) {
		rc = -errno;
		cfg_err(lc, from ? from : &file, from ? "include" : NULL,
			"cannot resolve the path of '%s': %s", path, strerror(-rc));
		goto out_close;
	}
	for (int i = 0; i < lc->depth; i++) {
		char chain[2048];
		size_t used = 0;

		if (strcmp(lc->stack[i].real, real))
			continue;
		for (int j = i; j < lc->depth && used < sizeof(chain); j++)
			used += snprintf(chain + used, sizeof(chain) - used, "%s -> ",
					 lc->stack[j].shown);
		if (used < sizeof(chain))
			snprintf(chain + used, sizeof(chain) - used, "%s", path);
		cfg_err(lc, from, "include", "include cycle: %s; remove one of these includes",
			chain);
		rc = -EINVAL;
		goto out_free_real;
	}
	if (lc->depth == MAX_INCLUDE_DEPTH) {
		cfg_err(lc, from, "include", "includes nested deeper than %d files",
			MAX_INCLUDE_DEPTH);
		rc = -EINVAL;
		goto out_free_real;
	}

	if (!yaml_parser_initialize(&parser)) {
		rc = -ENOMEM;
		goto out_free_real;
	}
	yaml_parser_set_input_file(&parser, fp);
	if (!yaml_parser_load(&parser, &doc)) {
		struct loc at = { path, (int)parser.problem_mark.line + 1,
				  (int)parser.problem_mark.column + 1 };

		if (parser.context)
			cfg_err(lc, &at, NULL, "YAML syntax error: %s (%s at line %d, column %d)",
				parser.problem, parser.context, (int)parser.context_mark.line + 1,
				(int)parser.context_mark.column + 1);
		else
			cfg_err(lc, &at, NULL, "YAML syntax error: %s",
				parser.problem ? parser.problem : "cannot parse");
		rc = -EINVAL;
		goto out_free_parser;
	}
	root = yaml_document_get_root_node(&doc);
	if (root) {	/* a second document would be silently ignored: refuse it */
		if (!yaml_parser_load(&parser, &extra)) {
			struct loc at = { path, (int)parser.problem_mark.line + 1,
					  (int)parser.problem_mark.column + 1 };

			cfg_err(lc, &at, NULL, "YAML syntax error: %s",
				parser.problem ? parser.problem : "cannot parse");
			rc = -EINVAL;
			goto out_free_doc;
		}
		if (yaml_document_get_root_node(&extra)) {
			struct loc at = { path, (int)extra.start_mark.line + 1,
					  (int)extra.start_mark.column + 1 };

			cfg_err(lc, &at, NULL, "a second YAML document; a config is one document");
			rc = -EINVAL;
		}
		yaml_document_delete(&extra);
		if (rc)
			goto out_free_doc;
	}
	if (!root || (root->type == YAML_SCALAR_NODE && is_null_scalar(root)))
		goto out_free_doc;	/* an empty file sets nothing */
	rc = refuse_aliases(lc, &doc, &file);
	if (rc)
		goto out_free_doc;
	if (root->type != YAML_MAPPING_NODE) {
		struct loc at = node_loc(&file, root);

		cfg_err(lc, &at, NULL, "expected a mapping of sections (model:, data:, train:, ...) "
			"at the top level, got %s", root->type == YAML_SCALAR_NODE ? "a scalar" :
			node_kind(root));
		rc = -EINVAL;
		goto out_free_doc;
	}
	rc = check_mapping_keys(lc, &doc, root, NULL, &file);
	if (rc)
		goto out_free_doc;

	lc->stack[lc->depth].shown = file.file;
	lc->stack[lc->depth].real = real;
	lc->depth++;
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
	     p < root->data.mapping.pairs.top && !rc; p++) {
		yaml_node_t *kn = yaml_document_get_node(&doc, p->key);

		if (!strcmp((char *)kn->data.scalar.value, "include"))
			rc = load_includes(lc, &doc, yaml_document_get_node(&doc, p->value), path,
					   &file);
	}
	lc->depth--;
	if (!rc)
		rc = apply_top(lc, &doc, root, &file);

out_free_doc:
	yaml_document_delete(&doc);
out_free_parser:
	yaml_parser_delete(&parser);
out_free_real:
	free(real);
out_close:
	fclose(fp);
	return rc;
}

/* One "key=value" override. */
static int apply_set(struct load_ctx *lc, const char *opt)
{
	char label[SL_PATH_MAX + 8], key[256];
	const char *eq = strchr(opt, '=');
	struct loc at;
	const struct key_def *k;
	size_t klen;

	snprintf(label, sizeof(label), "--set %s", opt);
	at.file = keep_name(lc, label);
	at.line = -1;	/* positions inside a --set value mean nothing to the user */
	at.col = 0;
	if (!at.file)
		return -ENOMEM;
	if (!eq) {
		at.line = 0;
		cfg_err(lc, &at, NULL, "expected KEY=VALUE, like --set train.batch=2");
		return -EINVAL;
	}
	klen = (size_t)(eq - opt);
	while (klen && isspace((unsigned char)opt[klen - 1]))
		klen--;
	while (klen && isspace((unsigned char)*opt))
		opt++, klen--;
	if (klen >= sizeof(key))
		klen = sizeof(key) - 1;
	memcpy(key, opt, klen);
	key[klen] = '\0';

	k = cfg_find_key(key);
	at.line = 0;
	if (!k) {
		const char *hint = cfg_suggest(key);

		if (!strcmp(key, "include"))
			cfg_err(lc, &at, key, "include works only in files");
		else if (cfg_is_section(key))
			cfg_err(lc, &at, key, "a section; set one of its keys, like --set %s.KEY=VALUE",
				key);
		else if (hint)
			cfg_err(lc, &at, key, "unknown key; did you mean '%s'?", hint);
		else
			cfg_err(lc, &at, key, "unknown key; 'shardlm config CONFIG' lists every key");
		return -EINVAL;
	}
	at.line = -1;
	if (cfg_set_from_text(lc, k, eq + 1, &at))
		return -EINVAL;
	at.line = 0;
	mark_set(lc, k, &at);
	return 0;
}

/* Checks that involve more than one key, after everything is merged. */
static int validate(struct load_ctx *lc, bool require_train, const char *top)
{
	struct sl_config *c = lc->cfg;
	struct loc dflt = { top ? top : "(config)", 0, 0 };
	int rc = 0;

	for (int i = 0; require_train && i < NKEYS; i++) {
		const char *v = field(c, &cfg_keys[i]);

		if (!cfg_keys[i].required || *v)
			continue;
		cfg_err(lc, &dflt, NULL, "missing required key %s (%s); add '%.*s: {%s: ...}' or "
			"pass --set %s=...", cfg_keys[i].key, dflt.file,
			(int)section_len(cfg_keys[i].key), cfg_keys[i].key,
			leaf_of(cfg_keys[i].key), cfg_keys[i].key);
		rc = -EINVAL;
	}

	if (c->train.steps == 0 && c->train.epochs == 0) {
		const struct loc *at = &lc->set_at[cfg_find_key("train.steps") - cfg_keys];

		cfg_err(lc, at->file ? at : &dflt, "train.steps",
			"0 means 'from train.epochs', but train.epochs is 0 too; set either");
		rc = -EINVAL;
	}
	if (c->optim.min_lr > c->optim.lr) {
		const struct loc *at = &lc->set_at[cfg_find_key("optim.min_lr") - cfg_keys];

		cfg_err(lc, at->file ? at : &dflt, "optim.min_lr", "%g is above optim.lr (%g); "
			"the schedule decays from lr down to min_lr", c->optim.min_lr, c->optim.lr);
		rc = -EINVAL;
	}
	return rc;
}

/* -------------------------------------------------------------------------------------------- */
/* public */

void sl_config_defaults(struct sl_config *cfg)
{
	struct load_ctx lc = { .cfg = cfg, .err = stderr };
	struct loc at = { "(built-in default)", -1, 0 };

	memset(cfg, 0, sizeof(*cfg));
	for (int i = 0; i < NKEYS; i++)
		if (cfg_set_from_text(&lc, &cfg_keys[i], cfg_keys[i].def, &at))
			abort();	/* the table itself is wrong */
}

static void set_name(struct sl_config *cfg, const char *path)
{
	const char *base = strrchr(path, '/');
	size_t n;

	base = base ? base + 1 : path;
	n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".yaml"))
		n -= 5;
	else if (n > 4 && !strcmp(base + n - 4, ".yml"))
		n -= 4;
	if (n >= sizeof(cfg->name))
		n = sizeof(cfg->name) - 1;
	memcpy(cfg->name, base, n);
	cfg->name[n] = '\0';
}

int sl_config_load_err(struct sl_config *cfg, const char *path, char *const *set, int nset,
		       bool require_train, FILE *err)
{
	struct load_ctx lc = { .cfg = cfg, .err = err ? err : stderr };
	const struct key_def *dir = cfg_find_key("run.dir");
	int rc = 0;

	sl_config_defaults(cfg);
	if (path) {
		struct loc at = { path, 0, 0 };

		if (!*path || strlen(path) >= sizeof(cfg->source)) {
			at.file = "shardlm";
			cfg_err(&lc, &at, NULL, "config file name %s", *path ? "too long" : "is empty");
			return -EINVAL;
		}
		strcpy(cfg->source, path);
		set_name(cfg, path);
		rc = load_file(&lc, path, NULL);
	}
	for (int i = 0; !rc && i < nset; i++)
		if (apply_set(&lc, set[i]))
			rc = -EINVAL;
	if (!rc && lc.nerr)
		rc = -EINVAL;
	if (!rc && !lc.set_at[dir - cfg_keys].file && cfg->name[0])
		snprintf(cfg->run.dir, sizeof(cfg->run.dir), "runs/%s", cfg->name);
	if (!rc)
		rc = validate(&lc, require_train, path);

	for (int i = 0; i < lc.nnames; i++)
		free(lc.names[i]);
	free(lc.names);
	return rc;
}

int sl_config_load(struct sl_config *cfg, const char *path, char *const *set, int nset,
		   bool require_train)
{
	return sl_config_load_err(cfg, path, set, nset, require_train, stderr);
}
