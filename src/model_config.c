/*
 * model_config: a Hugging Face config.json -> struct sl_model_config.
 *
 * One loader for every family: the keys all Qwen families share are read here, and a per-family
 * entry in the table below says where the text model's keys live (qwen3_5 nests them under
 * text_config), what the family's defaults are, and which layer and MLP kind each layer gets
 * (qwen3_moe adds experts, qwen3_5 reads layer_types).  Defaults follow transformers' own config
 * classes, since a config.json that omits a key means "the class default" there.
 * Errors name the file and the key and return a negative value.
 */
#include "model.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct family {
	const char *model_type;
	int default_head_dim;		/* when config.json has no head_dim */
	int default_max_position;
	/* the object holding the text model's keys (qwen3_5: text_config) */
	json_t *(*text_config)(json_t *root);
	/* family keys and the per-layer kinds; mc->n_layers is set, kinds allocated */
	int (*layers)(const char *path, json_t *tc, struct sl_model_config *mc);
	/* every layer's MLP is sparse: no intermediate_size (Qwen3_5MoeTextConfig has none) */
	bool all_moe;
};

static json_t *text_config_top(json_t *root)
{
	return root;
}

/*
 * Qwen3 dense: every layer is full attention with a SwiGLU MLP.  Sliding-window layers exist in
 * the config class but no released Qwen3 uses them; refuse rather than compute something else.
 */
static int qwen3_layers(const char *path, json_t *tc, struct sl_model_config *mc)
{
	json_t *sw = json_object_get(tc, "use_sliding_window");
	json_t *lt = json_object_get(tc, "layer_types");

	if (json_is_true(sw)) {
		sl_error("%s: use_sliding_window is true; shardlm computes full attention only "
			 "(set it to false if the model was trained without a window)", path);
		return -1;
	}
	if (lt && !json_is_null(lt)) {
		size_t i;
		json_t *v;

		if (!json_is_array(lt) || json_array_size(lt) != (size_t)mc->n_layers) {
			sl_error("%s: layer_types must be a list of num_hidden_layers (%d) strings",
				 path, mc->n_layers);
			return -1;
		}
		json_array_foreach(lt, i, v) {
			if (!json_is_string(v) || strcmp(json_string_value(v), "full_attention")) {
				sl_error("%s: layer_types[%zu] is %s; qwen3 supports full_attention "
					 "only", path, i,
					 json_is_string(v) ? json_string_value(v) : "not a string");
				return -1;
			}
		}
	}
	for (int l = 0; l < mc->n_layers; l++) {
		mc->layer_kind[l] = SL_LAYER_FULL_ATTENTION;
		mc->mlp_kind[l] = SL_MLP_DENSE;
	}
	return 0;
}

static int qwen3_moe_layers(const char *path, json_t *tc, struct sl_model_config *mc);
/* Qwen3.5 hybrid, defined at the end of the file */
static json_t *text_config_nested(json_t *root);
static int qwen35_layers(const char *path, json_t *tc, struct sl_model_config *mc);
static int qwen35_moe_layers(const char *path, json_t *tc, struct sl_model_config *mc);

static const struct family families[] = {
	/* Qwen3Config: head_dim 128, max_position_embeddings 32768 */
	{ "qwen3", 128, 32768, text_config_top, qwen3_layers, false },
	/* Qwen3MoeConfig: no head_dim key (hidden_size / num_attention_heads), 32768 positions */
	{ "qwen3_moe", 0, 32768, text_config_top, qwen3_moe_layers, false },
	/* Qwen3_5TextConfig: head_dim 256, max_position_embeddings 32768 */
	{ "qwen3_5_text", 256, 32768, text_config_top, qwen35_layers, false },
	/* Qwen3_5Config (vision-language): the language model's keys under text_config */
	{ "qwen3_5", 256, 32768, text_config_nested, qwen35_layers, false },
	/* Qwen3_5MoeTextConfig: head_dim 256, 32768 positions, every layer sparse */
	{ "qwen3_5_moe_text", 256, 32768, text_config_top, qwen35_moe_layers, true },
	/* Qwen3_5MoeConfig (vision-language): the language model's keys under text_config */
	{ "qwen3_5_moe", 256, 32768, text_config_nested, qwen35_moe_layers, true },
};

/* ---- typed key readers: each names the file and the key on error ---------------------------- */

/* present and not null */
static json_t *get(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_null(v) ? NULL : v;
}

static int get_int(const char *path, json_t *o, const char *key, bool required, int def,
		   int *out)
{
	json_t *v = get(o, key);

	if (!v) {
		if (required) {
			sl_error("%s: required key %s is missing", path, key);
			return -1;
		}
		*out = def;
		return 0;
	}
	/* transformers writes some integers as 4096.0 after arithmetic; accept exact ones */
	if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
	    fabs(json_real_value(v)) < 2e9) {
		*out = (int)json_real_value(v);
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) > 2147483647LL ||
	    json_integer_value(v) < -2147483648LL) {
		sl_error("%s: key %s must be an integer", path, key);
		return -1;
	}
	*out = (int)json_integer_value(v);
	return 0;
}

static int get_positive(const char *path, json_t *o, const char *key, bool required, int def,
			int *out)
{
	if (get_int(path, o, key, required, def, out))
		return -1;
	if (*out <= 0) {
		sl_error("%s: key %s must be positive (is %d)", path, key, *out);
		return -1;
	}
	return 0;
}

static int get_double(const char *path, json_t *o, const char *key, double def, double *out)
{
	json_t *v = get(o, key);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_number(v)) {
		sl_error("%s: key %s must be a number", path, key);
		return -1;
	}
	*out = json_number_value(v);
	return 0;
}

static int get_bool(const char *path, json_t *o, const char *key, bool def, bool *out)
{
	json_t *v = get(o, key);

	if (!v) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v)) {
		sl_error("%s: key %s must be true or false", path, key);
		return -1;
	}
	*out = json_is_true(v);
	return 0;
}

/* a token id: null or absent -> -1; a list (eos of chat models) -> its first element */
static int get_token(const char *path, json_t *o, const char *key, int *out)
{
	json_t *v = get(o, key);

	*out = -1;
	if (!v)
		return 0;
	if (json_is_array(v)) {
		if (json_array_size(v) == 0)
			return 0;
		v = json_array_get(v, 0);
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > 2147483647LL) {
		sl_error("%s: key %s must be a non-negative token id, a list of them, or null",
			 path, key);
		return -1;
	}
	*out = (int)json_integer_value(v);
	return 0;
}

/*
 * rope_theta at the top level (hub checkpoints) or rope_parameters {rope_type, rope_theta} (newer
 * transformers).  Only the plain rotary embedding is implemented, so any scaling is refused.
 */
static int get_rope(const char *path, json_t *tc, double *theta)
{
	json_t *rp = get(tc, "rope_parameters");
	json_t *rs = get(tc, "rope_scaling");
	bool have_top = get(tc, "rope_theta") != NULL;
	double top = 10000.0;	/* transformers' default base when nothing says otherwise */

	if (get_double(path, tc, "rope_theta", top, &top))
		return -1;
	*theta = top;
	if (rs) {
		json_t *t = json_is_object(rs) ? json_object_get(rs, "rope_type") : NULL;

		if (!t)
			t = json_is_object(rs) ? json_object_get(rs, "type") : NULL;
		if (!json_is_string(t) || strcmp(json_string_value(t), "default")) {
			sl_error("%s: rope_scaling %s is not supported (only the default rotary "
				 "embedding; remove rope_scaling or set it to null)", path,
				 json_is_string(t) ? json_string_value(t) : "(no rope_type)");
			return -1;
		}
	}
	if (!rp)
		return 0;
	if (!json_is_object(rp)) {
		sl_error("%s: key rope_parameters must be an object", path);
		return -1;
	}
	{
		json_t *type = get(rp, "rope_type");
		json_t *th = get(rp, "rope_theta");

		if (type && (!json_is_string(type) ||
			     strcmp(json_string_value(type), "default"))) {
			sl_error("%s: rope_parameters.rope_type is '%s'; only 'default' is supported "
				 "(no rope scaling)", path,
				 json_is_string(type) ? json_string_value(type) : "not a string");
			return -1;
		}
		if (!th) {
			if (!have_top) {
				sl_error("%s: rope_parameters has no rope_theta", path);
				return -1;
			}
			return 0;
		}
		if (!json_is_number(th)) {
			sl_error("%s: key rope_parameters.rope_theta must be a number", path);
			return -1;
		}
		if (have_top && json_number_value(th) != top) {
			sl_error("%s: rope_theta (%g) and rope_parameters.rope_theta (%g) disagree; "
				 "keep one", path, top, json_number_value(th));
			return -1;
		}
		*theta = json_number_value(th);
	}
	return 0;
}

/* num_labels: the size of id2label when present (what transformers derives it from) */
static int get_num_labels(const char *path, json_t *tc, int *out)
{
	json_t *id2label = get(tc, "id2label");

	if (id2label) {
		if (!json_is_object(id2label) || json_object_size(id2label) == 0) {
			sl_error("%s: key id2label must be a non-empty object", path);
			return -1;
		}
		*out = (int)json_object_size(id2label);
		return 0;
	}
	return get_positive(path, tc, "num_labels", false, 1, out);
}

static const struct family *find_family(const char *path, const char *type)
{
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
		if (!strcmp(families[i].model_type, type))
			return &families[i];
	sl_error("%s: model_type '%s' is not supported (qwen3, qwen3_moe, qwen3_5, qwen3_5_text, "
		 "qwen3_5_moe, qwen3_5_moe_text)", path, type);
	return NULL;
}

/*
 * The expert keys both MoE families share, with the family's defaults.  transformers 5 writes
 * num_local_experts for qwen3_moe (num_experts is its attribute alias); older files num_experts.
 */
static int moe_keys(const char *path, json_t *tc, struct sl_model_config *mc, int def_e,
		    int def_k, int def_im)
{
	int ne = -1, nle = -1;

	if ((get(tc, "num_experts") && get_int(path, tc, "num_experts", false, 0, &ne)) ||
	    (get(tc, "num_local_experts") &&
	     get_int(path, tc, "num_local_experts", false, 0, &nle)))
		return -1;
	if (ne >= 0 && nle >= 0 && ne != nle) {
		sl_error("%s: num_experts (%d) and num_local_experts (%d) disagree; keep one", path,
			 ne, nle);
		return -1;
	}
	mc->n_experts = ne >= 0 ? ne : nle >= 0 ? nle : def_e;
	if (get_positive(path, tc, "num_experts_per_tok", false, def_k, &mc->top_k) ||
	    get_positive(path, tc, "moe_intermediate_size", false, def_im, &mc->moe_intermediate) ||
	    get_double(path, tc, "router_aux_loss_coef", 0.001, &mc->router_aux_loss_coef))
		return -1;
	if (mc->n_experts < 0 || mc->n_experts > 4096) {
		sl_error("%s: num_experts must be in 0..4096 (is %d)", path, mc->n_experts);
		return -1;
	}
	if (mc->n_experts && mc->top_k > mc->n_experts) {
		sl_error("%s: num_experts_per_tok (%d) exceeds num_experts (%d)", path, mc->top_k,
			 mc->n_experts);
		return -1;
	}
	if (!(mc->router_aux_loss_coef >= 0) || !isfinite(mc->router_aux_loss_coef)) {
		sl_error("%s: router_aux_loss_coef must be a finite number >= 0 (is %g)", path,
			 mc->router_aux_loss_coef);
		return -1;
	}
	if ((double)mc->n_experts * mc->moe_intermediate * mc->hidden * mc->n_layers > 1e13) {
		sl_error("%s: %d experts of %d x %d in %d layers: more than any model shardlm can "
			 "train; the file is damaged", path, mc->n_experts, mc->moe_intermediate,
			 mc->hidden, mc->n_layers);
		return -1;
	}
	return 0;
}

/*
 * Qwen3-MoE: attention as qwen3; layer l has the sparse MLP unless it is in mlp_only_layers, as
 * Qwen3MoeDecoderLayer decides: num_experts > 0 and (l + 1) % decoder_sparse_step == 0.
 */
static int qwen3_moe_layers(const char *path, json_t *tc, struct sl_model_config *mc)
{
	json_t *only = get(tc, "mlp_only_layers");
	int step;
	size_t i;
	json_t *v;

	if (qwen3_layers(path, tc, mc) || moe_keys(path, tc, mc, 128, 8, 768) ||
	    get_positive(path, tc, "decoder_sparse_step", false, 1, &step) ||
	    get_bool(path, tc, "norm_topk_prob", false, &mc->norm_topk_prob))
		return -1;
	for (int l = 0; l < mc->n_layers; l++)
		mc->mlp_kind[l] = mc->n_experts > 0 && (l + 1) % step == 0 ? SL_MLP_MOE :
			SL_MLP_DENSE;
	if (only && !json_is_array(only)) {
		sl_error("%s: key mlp_only_layers must be a list of layer indices", path);
		return -1;
	}
	json_array_foreach(only, i, v) {
		json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;

		if (l < 0 || l >= mc->n_layers) {
			sl_error("%s: mlp_only_layers[%zu] must be a layer index in 0..%d", path, i,
				 mc->n_layers - 1);
			return -1;
		}
		mc->mlp_kind[l] = SL_MLP_DENSE;
	}
	return 0;
}

int sl_model_config_load(struct sl_model_config *mc, const char *path)
{
	const struct family *fam;
	json_error_t jerr;
	json_t *root, *tc, *v;
	int ret = -1;

	memset(mc, 0, sizeof(*mc));
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (jerr.line < 0)
			sl_error("%s: cannot read the model config: %s", path, jerr.text);
		else
			sl_error("%s:%d:%d: config.json is not valid JSON: %s", path, jerr.line,
				 jerr.column, jerr.text);
		return -1;
	}
	if (!json_is_object(root)) {
		sl_error("%s: config.json must be a JSON object", path);
		goto out_free_root;
	}

	v = get(root, "model_type");
	if (!json_is_string(v)) {
		sl_error("%s: required key model_type is missing (or not a string)", path);
		goto out_free_root;
	}
	fam = find_family(path, json_string_value(v));
	if (!fam)
		goto out_free_root;
	snprintf(mc->model_type, sizeof(mc->model_type), "%s", fam->model_type);

	v = get(root, "architectures");
	if (v && (!json_is_array(v) || (json_array_size(v) &&
					!json_is_string(json_array_get(v, 0))))) {
		sl_error("%s: key architectures must be a list of strings", path);
		goto out_free_root;
	}
	if (v && json_array_size(v))
		snprintf(mc->architecture, sizeof(mc->architecture), "%s",
			 json_string_value(json_array_get(v, 0)));

	tc = fam->text_config(root);
	if (!tc) {
		sl_error("%s: model_type %s keeps the language model's keys in the object "
			 "text_config, which is missing", path, fam->model_type);
		goto out_free_root;
	}

	if (get_positive(path, tc, "vocab_size", true, 0, &mc->vocab) ||
	    get_positive(path, tc, "hidden_size", true, 0, &mc->hidden) ||
	    get_positive(path, tc, "num_hidden_layers", true, 0, &mc->n_layers) ||
	    get_positive(path, tc, "num_attention_heads", true, 0, &mc->n_heads) ||
	    get_positive(path, tc, "num_key_value_heads", false, mc->n_heads, &mc->n_kv_heads) ||
	    get_positive(path, tc, "head_dim", false, fam->default_head_dim ?
			 fam->default_head_dim : mc->hidden / mc->n_heads, &mc->head_dim) ||
	    get_int(path, tc, "intermediate_size", !fam->all_moe, 0, &mc->intermediate) ||
	    get_positive(path, tc, "max_position_embeddings", false, fam->default_max_position,
			 &mc->max_position) ||
	    get_double(path, tc, "rms_norm_eps", 1e-6, &mc->rms_eps) ||
	    get_rope(path, tc, &mc->rope_theta) ||
	    get_bool(path, tc, "attention_bias", false, &mc->attention_bias) ||
	    get_bool(path, root, "tie_word_embeddings", false, &mc->tie_word_embeddings) ||
	    get_double(path, tc, "initializer_range", 0.02, &mc->initializer_range) ||
	    get_token(path, get(root, "pad_token_id") ? root : tc, "pad_token_id",
		      &mc->pad_token_id) ||
	    get_token(path, get(root, "bos_token_id") ? root : tc, "bos_token_id",
		      &mc->bos_token_id) ||
	    get_token(path, get(root, "eos_token_id") ? root : tc, "eos_token_id",
		      &mc->eos_token_id) ||
	    get_num_labels(path, root, &mc->num_labels))
		goto out_free_root;

	if (mc->intermediate < 0 || (!fam->all_moe && mc->intermediate == 0)) {
		sl_error("%s: key intermediate_size must be positive (is %d)", path,
			 mc->intermediate);
		goto out_free_root;
	}
	if (fam->all_moe)
		mc->intermediate = 0;	/* no dense MLP: the key, if any, sizes nothing */
	if (mc->n_heads % mc->n_kv_heads) {
		sl_error("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads "
			 "(%d)", path, mc->n_heads, mc->n_kv_heads);
		goto out_free_root;
	}
	/* sizes from the file size every buffer: bound them before anything is allocated */
	if ((double)mc->vocab * mc->hidden > 1e12 || (double)mc->n_heads * mc->head_dim > 1e6 ||
	    (double)mc->hidden * mc->intermediate * mc->n_layers > 1e13) {
		sl_error("%s: vocab_size %d, hidden_size %d, intermediate_size %d, %d layers, %d "
			 "heads of %d: more than any model shardlm can train; the file is damaged",
			 path, mc->vocab, mc->hidden, mc->intermediate, mc->n_layers, mc->n_heads,
			 mc->head_dim);
		goto out_free_root;
	}
	if (mc->head_dim % 2) {
		sl_error("%s: head_dim (%d) must be even (the rotary embedding rotates pairs)", path,
			 mc->head_dim);
		goto out_free_root;
	}
	if (!(mc->rms_eps > 0)) {
		sl_error("%s: key rms_norm_eps must be positive (is %g)", path, mc->rms_eps);
		goto out_free_root;
	}
	if (!(mc->rope_theta > 0)) {
		sl_error("%s: key rope_theta must be positive (is %g)", path, mc->rope_theta);
		goto out_free_root;
	}
	if (!(mc->initializer_range > 0)) {
		sl_error("%s: key initializer_range must be positive (is %g)", path,
			 mc->initializer_range);
		goto out_free_root;
	}

	mc->layer_kind = calloc(mc->n_layers, sizeof(*mc->layer_kind));
	mc->mlp_kind = calloc(mc->n_layers, sizeof(*mc->mlp_kind));
	if (!mc->layer_kind || !mc->mlp_kind) {
		sl_error("%s: out of memory for %d layers", path, mc->n_layers);
		goto out_free_kinds;
	}
	if (fam->layers(path, tc, mc))
		goto out_free_kinds;
	ret = 0;
	goto out_free_root;

out_free_kinds:
	sl_model_config_free(mc);
out_free_root:
	json_decref(root);
	return ret;
}

void sl_model_config_free(struct sl_model_config *mc)
{
	free(mc->layer_kind);
	free(mc->mlp_kind);
	mc->layer_kind = NULL;
	mc->mlp_kind = NULL;
}

/* ---- Qwen3.5 hybrid ------------------------------------------------------------------------ */

static json_t *text_config_nested(json_t *root)
{
	json_t *tc = get(root, "text_config");

	return json_is_object(tc) ? tc : NULL;
}

/*
 * partial_rotary_factor: in rope_parameters (what transformers 5 writes), else at the top level
 * or in rope_scaling (older files); Qwen3_5TextConfig's default is 0.25.
 */
static int get_partial_rotary(const char *path, json_t *tc, double *out)
{
	static const char *const holders[] = { "rope_parameters", "rope_scaling" };

	for (size_t i = 0; i < 2; i++) {
		json_t *o = get(tc, holders[i]);

		if (json_is_object(o) && get(o, "partial_rotary_factor")) {
			if (!json_is_number(get(o, "partial_rotary_factor"))) {
				sl_error("%s: key %s.partial_rotary_factor must be a number", path,
					 holders[i]);
				return -1;
			}
			*out = json_number_value(get(o, "partial_rotary_factor"));
			return 0;
		}
	}
	return get_double(path, tc, "partial_rotary_factor", 0.25, out);
}

/*
 * Qwen3.5: layer_types (or, without it, every full_attention_interval-th layer full attention)
 * decides each layer's kind; the gated attention and Gated DeltaNet dims; RMSNorms scale by
 * (1 + weight).  As in transformers, the attention output gate is always on (attn_output_gate
 * is not read there either).
 */
static int qwen35_layers(const char *path, json_t *tc, struct sl_model_config *mc)
{
	json_t *lt = get(tc, "layer_types"), *act = get(tc, "hidden_act");
	int interval;
	double prf;

	mc->norm_offset = true;
	if (get_positive(path, tc, "linear_num_key_heads", false, 16, &mc->lin_nk) ||
	    get_positive(path, tc, "linear_num_value_heads", false, 32, &mc->lin_nv) ||
	    get_positive(path, tc, "linear_key_head_dim", false, 128, &mc->lin_dk) ||
	    get_positive(path, tc, "linear_value_head_dim", false, 128, &mc->lin_dv) ||
	    get_positive(path, tc, "linear_conv_kernel_dim", false, 4, &mc->lin_conv) ||
	    get_positive(path, tc, "full_attention_interval", false, 4, &interval) ||
	    get_partial_rotary(path, tc, &prf))
		return -1;
	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
		sl_error("%s: hidden_act must be silu (is %s)", path,
			 json_is_string(act) ? json_string_value(act) : "not a string");
		return -1;
	}
	if (mc->attention_bias) {
		sl_error("%s: attention_bias true is not supported for %s yet", path,
			 mc->model_type);
		return -1;
	}
	if (mc->lin_nv % mc->lin_nk) {
		sl_error("%s: linear_num_value_heads (%d) must be a multiple of "
			 "linear_num_key_heads (%d)", path, mc->lin_nv, mc->lin_nk);
		return -1;
	}
	if ((double)mc->lin_nv * mc->lin_dk * mc->lin_dv > 1e8 || mc->lin_conv > 64) {
		sl_error("%s: linear attention dims (%d heads of %d x %d, kernel %d) are beyond any "
			 "model shardlm can train; the file is damaged", path, mc->lin_nv,
			 mc->lin_dk, mc->lin_dv, mc->lin_conv);
		return -1;
	}
	/* transformers: dim = int(head_dim * partial_rotary_factor), rotated as pairs */
	mc->rot_dim = (int)(mc->head_dim * prf);
	if (!(prf > 0 && prf <= 1) || mc->rot_dim < 2 || mc->rot_dim % 2) {
		sl_error("%s: partial_rotary_factor %g of head_dim %d must give an even number of "
			 "rotated dims (gives %d)", path, prf, mc->head_dim, mc->rot_dim);
		return -1;
	}
	if (lt) {
		size_t i;
		json_t *v;

		if (!json_is_array(lt) || json_array_size(lt) != (size_t)mc->n_layers) {
			sl_error("%s: layer_types must be a list of num_hidden_layers (%d) strings",
				 path, mc->n_layers);
			return -1;
		}
		json_array_foreach(lt, i, v) {
			const char *s = json_is_string(v) ? json_string_value(v) : "";

			if (!strcmp(s, "linear_attention")) {
				mc->layer_kind[i] = SL_LAYER_LINEAR_ATTENTION;
			} else if (!strcmp(s, "full_attention")) {
				mc->layer_kind[i] = SL_LAYER_GATED_ATTENTION;
			} else {
				sl_error("%s: layer_types[%zu] is '%s'; %s layers are "
					 "linear_attention or full_attention", path, i,
					 json_is_string(v) ? s : "not a string", mc->model_type);
				return -1;
			}
		}
	} else {
		for (int l = 0; l < mc->n_layers; l++)
			mc->layer_kind[l] = (l + 1) % interval ? SL_LAYER_LINEAR_ATTENTION :
								 SL_LAYER_GATED_ATTENTION;
	}
	for (int l = 0; l < mc->n_layers; l++)
		mc->mlp_kind[l] = SL_MLP_DENSE;
	return 0;
}

/*
 * Qwen3.5-MoE: the hybrid's layers (layer_types, Gated DeltaNet, gated attention) with a sparse
 * MLP in every layer (Qwen3_5MoeDecoderLayer has no dense one; mlp_only_layers and
 * decoder_sparse_step are not read there either), whose router always renormalizes the top-k
 * weights (Qwen3_5MoeTopKRouter: no norm_topk_prob), plus the shared expert.  Defaults are
 * Qwen3_5MoeTextConfig's.
 */
static int qwen35_moe_layers(const char *path, json_t *tc, struct sl_model_config *mc)
{
	if (qwen35_layers(path, tc, mc) || moe_keys(path, tc, mc, 256, 8, 512) ||
	    get_positive(path, tc, "shared_expert_intermediate_size", false, 512,
			 &mc->shared_intermediate))
		return -1;
	if (mc->n_experts < 1) {
		sl_error("%s: num_experts must be positive for %s (is %d)", path, mc->model_type,
			 mc->n_experts);
		return -1;
	}
	if ((double)mc->shared_intermediate * mc->hidden * mc->n_layers > 1e13) {
		sl_error("%s: shared_expert_intermediate_size %d: more than any model shardlm can "
			 "train; the file is damaged", path, mc->shared_intermediate);
		return -1;
	}
	mc->norm_topk_prob = true;
	for (int l = 0; l < mc->n_layers; l++)
		mc->mlp_kind[l] = SL_MLP_MOE;
	return 0;
}
