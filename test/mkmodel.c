/*
 * mkmodel: writes a tiny Qwen3 model in the Hugging Face format with random weights.
 *
 * DIR/config.json is what transformers writes for Qwen3ForSequenceClassification (or
 * Qwen3ForCausalLM with --no-score), and DIR/model.safetensors holds every tensor under its HF name,
 * so the same directory loads in shardlm and in transformers.  The demo model and the test models
 * come from here; weights are a pure function of the options and --seed.
 *
 * usage: mkmodel --out DIR --vocab N --hidden N --layers N --heads N --kv-heads N --head-dim N
 *                --intermediate N [--seed S] [--bias] [--tie] [--no-score] [--dtype f32|bf16]
 *                [--max-pos N] [--std X]
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "safetensors.h"

struct opts {
	const char *out;
	int vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, max_pos;
	unsigned long long seed;
	bool bias, tie, no_score;
	enum sl_dtype dtype;
	double std;
};

struct tensors {
	int n, cap;
	struct sl_st_out *t;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: mkmodel --out DIR --vocab N --hidden N --layers N --heads N "
		"--kv-heads N --head-dim N\n"
		"               --intermediate N [--seed S] [--bias] [--tie] [--no-score]\n"
		"               [--dtype f32|bf16] [--max-pos N] [--std X]\n");
}

/* mkdir -p */
static int mkdirs(const char *path)
{
	char p[4096];

	snprintf(p, sizeof(p), "%s", path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0777) && errno != EEXIST)
			goto out_error;
		*s = '/';
	}
	if (mkdir(p, 0777) && errno != EEXIST)
		goto out_error;
	return 0;

out_error:
	sl_error("%s: cannot create: %s", p, strerror(errno));
	return -1;
}

/*
 * A tensor filled by fill(): std > 0 normal, std == 0 ones, std < 0 zeros.  Each tensor draws
 * from its own stream (seed, index), so adding a tensor does not change the others.
 */
static int add(struct tensors *ts, unsigned long long seed, const char *name, int ndim,
	       int64_t d0, int64_t d1, double std)
{
	struct sl_st_out *t;
	size_t numel = ndim == 1 ? (size_t)d0 : (size_t)d0 * d1;
	float *x;

	if (ts->n == ts->cap) {
		ts->cap = ts->cap ? 2 * ts->cap : 64;
		t = realloc(ts->t, ts->cap * sizeof(*t));
		if (!t)
			return -1;
		ts->t = t;
	}
	x = malloc(numel * sizeof(*x));
	if (!x)
		return -1;
	if (std > 0)
		sl_st_fill_normal(x, numel, std, seed * 1000003ull + ts->n);
	for (size_t i = 0; std <= 0 && i < numel; i++)
		x[i] = std == 0 ? 1.0f : 0.0f;
	t = &ts->t[ts->n++];
	t->name = strdup(name);
	t->ndim = ndim;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->data = x;
	return t->name ? 0 : -1;
}

static int make_weights(const struct opts *o, struct tensors *ts)
{
	int64_t H = o->hidden, I = o->intermediate, hd = o->head_dim;
	int64_t q = (int64_t)o->heads * hd, kv = (int64_t)o->kv_heads * hd;
	unsigned long long s = o->seed;
	char n[160];
	int err = 0;

	err |= add(ts, s, "model.embed_tokens.weight", 2, o->vocab, H, o->std);
	for (int l = 0; l < o->layers; l++) {
#define T(suffix, nd, a, b, std)                                                              \
	do {                                                                                  \
		snprintf(n, sizeof(n), "model.layers.%d.%s", l, suffix);                      \
		err |= add(ts, s, n, nd, a, b, std);                                          \
	} while (0)
		T("input_layernorm.weight", 1, H, 0, 0);
		T("self_attn.q_proj.weight", 2, q, H, o->std);
		T("self_attn.k_proj.weight", 2, kv, H, o->std);
		T("self_attn.v_proj.weight", 2, kv, H, o->std);
		T("self_attn.o_proj.weight", 2, H, q, o->std);
		if (o->bias) {
			/* biases random too, so tests see them matter */
			T("self_attn.q_proj.bias", 1, q, 0, 0.02);
			T("self_attn.k_proj.bias", 1, kv, 0, 0.02);
			T("self_attn.v_proj.bias", 1, kv, 0, 0.02);
			T("self_attn.o_proj.bias", 1, H, 0, 0.02);
		}
		T("self_attn.q_norm.weight", 1, hd, 0, 0);
		T("self_attn.k_norm.weight", 1, hd, 0, 0);
		T("post_attention_layernorm.weight", 1, H, 0, 0);
		T("mlp.gate_proj.weight", 2, I, H, o->std);
		T("mlp.up_proj.weight", 2, I, H, o->std);
		T("mlp.down_proj.weight", 2, H, I, o->std);
#undef T
	}
	err |= add(ts, s, "model.norm.weight", 1, H, 0, 0);
	if (!o->no_score)
		err |= add(ts, s, "score.weight", 2, 1, H, 0.02);
	else if (!o->tie)
		err |= add(ts, s, "lm_head.weight", 2, o->vocab, H, o->std);
	return err ? -1 : 0;
}

/* the keys and values transformers' Qwen3Config.save_pretrained writes */
static int write_config(const struct opts *o, const char *path)
{
	const char *dt = o->dtype == SL_DT_BF16 ? "bfloat16" : "float32";
	json_t *c;
	int ret;

	c = json_pack("{s:[s],s:b,s:f,s:i,s:i,s:s,s:i,s:f,s:i,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:f,"
		      "s:n,s:f,s:n,s:b,s:s,s:s,s:s,s:b,s:b,s:i}",
		      "architectures",
		      o->no_score ? "Qwen3ForCausalLM" : "Qwen3ForSequenceClassification",
		      "attention_bias", o->bias,
		      "attention_dropout", 0.0,
		      "bos_token_id", o->vocab - 1,
		      "eos_token_id", o->vocab - 1,
		      "hidden_act", "silu",
		      "hidden_size", o->hidden,
		      "initializer_range", 0.02,
		      "intermediate_size", o->intermediate,
		      "max_position_embeddings", o->max_pos,
		      "max_window_layers", o->layers,
		      "model_type", "qwen3",
		      "num_attention_heads", o->heads,
		      "num_hidden_layers", o->layers,
		      "num_key_value_heads", o->kv_heads,
		      "head_dim", o->head_dim,
		      "rms_norm_eps", 1e-6,
		      "rope_scaling",
		      "rope_theta", 1000000.0,
		      "sliding_window",
		      "tie_word_embeddings", o->tie,
		      "torch_dtype", dt,
		      "dtype", dt,
		      "transformers_version", "4.51.0",
		      "use_cache", 1,
		      "use_sliding_window", 0,
		      "vocab_size", o->vocab);
	if (!c)
		return -1;
	json_object_set_new(c, "pad_token_id", json_integer(0));
	if (!o->no_score) {
		json_object_set_new(c, "id2label", json_pack("{s:s}", "0", "LABEL_0"));
		json_object_set_new(c, "label2id", json_pack("{s:i}", "LABEL_0", 0));
		json_object_set_new(c, "num_labels", json_integer(1));
	}
	ret = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
	json_decref(c);
	if (ret)
		sl_error("%s: cannot write", path);
	return ret ? -1 : 0;
}

static int parse_int(const char *opt, const char *s, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);

	if (*end || v <= 0 || v > 1 << 30) {
		sl_error("--%s: '%s' is not a positive integer", opt, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "out", 1, 0, 'o' },	    { "vocab", 1, 0, 'v' },	 { "hidden", 1, 0, 'H' },
		{ "layers", 1, 0, 'l' },    { "heads", 1, 0, 'n' },	 { "kv-heads", 1, 0, 'k' },
		{ "head-dim", 1, 0, 'd' },  { "intermediate", 1, 0, 'I' },
		{ "seed", 1, 0, 's' },	    { "bias", 0, 0, 'b' },	 { "tie", 0, 0, 't' },
		{ "no-score", 0, 0, 'N' },  { "dtype", 1, 0, 'D' },	 { "max-pos", 1, 0, 'm' },
		{ "std", 1, 0, 'S' },	    { "help", 0, 0, 'h' },	 { 0, 0, 0, 0 },
	};
	struct opts o = { .dtype = SL_DT_F32, .max_pos = 4096 };
	struct tensors ts = { 0 };
	char path[4096];
	int c, ret = 1;

	sl_log_init();
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		const char *name = lo[0].name;

		for (int i = 0; lo[i].name; i++)
			if (lo[i].val == c)
				name = lo[i].name;
		switch (c) {
		case 'o': o.out = optarg; break;
		case 'v': if (parse_int(name, optarg, &o.vocab)) return 2; break;
		case 'H': if (parse_int(name, optarg, &o.hidden)) return 2; break;
		case 'l': if (parse_int(name, optarg, &o.layers)) return 2; break;
		case 'n': if (parse_int(name, optarg, &o.heads)) return 2; break;
		case 'k': if (parse_int(name, optarg, &o.kv_heads)) return 2; break;
		case 'd': if (parse_int(name, optarg, &o.head_dim)) return 2; break;
		case 'I': if (parse_int(name, optarg, &o.intermediate)) return 2; break;
		case 'm': if (parse_int(name, optarg, &o.max_pos)) return 2; break;
		case 's': o.seed = strtoull(optarg, NULL, 10); break;
		case 'b': o.bias = true; break;
		case 't': o.tie = true; break;
		case 'N': o.no_score = true; break;
		case 'S': o.std = atof(optarg); break;
		case 'D':
			if (!strcmp(optarg, "f32")) {
				o.dtype = SL_DT_F32;
			} else if (!strcmp(optarg, "bf16")) {
				o.dtype = SL_DT_BF16;
			} else {
				sl_error("--dtype: '%s' is not f32 or bf16", optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !o.out || !o.vocab || !o.hidden || !o.layers || !o.heads ||
	    !o.kv_heads || !o.head_dim || !o.intermediate) {
		usage(stderr);
		return 2;
	}
	if (o.heads % o.kv_heads || o.head_dim % 2) {
		sl_error("--heads must be a multiple of --kv-heads and --head-dim even");
		return 2;
	}
	/*
	 * Variance-preserving scale for the tiny dims (1/sqrt(fan_in) ~ 0.06-0.1 there, not HF's
	 * 0.02, which makes a 64-wide model nearly constant): outputs that vary with the input, and
	 * activations that stay O(1) through the layers.
	 */
	if (o.std <= 0)
		o.std = 0.5 / sqrt(o.hidden);

	if (mkdirs(o.out) || make_weights(&o, &ts))
		goto out_free;
	snprintf(path, sizeof(path), "%s/config.json", o.out);
	if (write_config(&o, path))
		goto out_free;
	snprintf(path, sizeof(path), "%s/model.safetensors", o.out);
	if (sl_st_write(path, ts.t, ts.n, o.dtype))
		goto out_free;
	ret = 0;

out_free:
	for (int i = 0; i < ts.n; i++) {
		free((char *)ts.t[i].name);
		free((float *)ts.t[i].data);
	}
	free(ts.t);
	return ret;
}
