/*
 * plan: memory planner (see plan.h).
 *
 * Every count below names the buffer it stands for; when shard.c, model.c, model_qwen35.c,
 * train.c or a backend changes what it allocates, this file changes with it (test_plan checks the
 * cpu counts against what the code allocates on a small Qwen3 and a small Qwen3.5 model).  Each
 * buffer is rounded up to the backend allocator's granularity: 64 bytes on cpu (aligned_alloc),
 * 256 on cuda (its arena).
 */
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "modelio.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define CUDA_WORKSPACE (32ull << 20)	/* cuBLASLt workspace (cuda/context.cu) */
#define CUDA_SCRATCH (64ull << 20)	/* reduction scratch (cuda/context.cu) */
#define CUDA_SIDE_SCRATCH (64ull << 10)	/* the side stream's (cuda/common.cuh) */
/*
 * Outside the arena: the CUDA context, the kernels, cuBLAS(Lt) and NCCL's own allocations.  The
 * H200 showed 1.84 to 1.88 GiB of device memory in use beyond the arena's chunks, one rank,
 * three placements (bench/plan_vs_device.sh, 2026-11-30; NCCL across several GPUs adds more).
 */
#define CUDA_CONTEXT (1900ull << 20)

static const char *const cat_name[SL_PLAN_N] = {
	[SL_PLAN_WEIGHTS] = "weights",
	[SL_PLAN_GRADS] = "gradients",
	[SL_PLAN_OPTIM] = "master + moments (fp32)",
	[SL_PLAN_ACTS] = "activations",
	[SL_PLAN_COMM] = "communication buffers",
	[SL_PLAN_WORKSPACE] = "workspace",
	[SL_PLAN_HEAD] = "head / loss / batch",
	[SL_PLAN_RUNTIME] = "CUDA context (estimate)",
	[SL_PLAN_CKPT] = "checkpoint staging",
};

struct counter {
	size_t align;
};

/* one allocation of @bytes, as the allocator hands it out */
static size_t A(const struct counter *k, size_t bytes)
{
	if (!bytes)
		bytes = 1;
	return (bytes + k->align - 1) / k->align * k->align;
}

static size_t zmax(size_t a, size_t b)
{
	return a > b ? a : b;
}

static size_t zmin(size_t a, size_t b)
{
	return a < b ? a : b;
}

/*
 * model.c: what every family's sl_model_create allocates besides its layers: the layer inputs,
 * the backward's shared gradient buffers, the head's (SL_PLAN_ACTS, SL_PLAN_HEAD).  @sft: the
 * causal-LM head (the layout has no score.weight), whose rows are every token, its logits
 * computed in chunks of at most 256 MiB (at least 64 rows, at most T).
 */
static void count_common(const struct counter *k, const struct sl_model_config *mc, size_t T,
			 size_t B, bool sft, size_t e, size_t s, size_t out[SL_PLAN_N])
{
	const size_t H = mc->hidden, I = mc->intermediate, nh = mc->n_heads, nkv = mc->n_kv_heads;
	const size_t hd = mc->head_dim, Q = (nh + 2 * nkv) * hd, nL = mc->n_layers;

	if (sft) {
		size_t rows = ((size_t)256 << 20) / ((size_t)mc->vocab * e);
		size_t chunk = rows < 64 ? 64 : rows > T ? T : rows;

		out[SL_PLAN_HEAD] += A(k, chunk * mc->vocab * e)	/* lg */
			+ A(k, chunk * sizeof(float));			/* row_loss */
		B = T;
	}

	out[SL_PLAN_ACTS] += (nL + 1) * A(k, T * H * e)	/* x: every layer's input + final */
		+ 2 * A(k, T * H * e)			/* gx, gn */
		+ A(k, T * zmax(2 * I, Q) * e)		/* gb1 */
		+ A(k, T * zmax(zmax(I, Q), nh * hd) * e);	/* gb2 */
	out[SL_PLAN_HEAD] += 4 * A(k, B * H * e)	/* xl, xnf, gxnf, gxl */
		+ A(k, B * s)				/* rstdf */
		+ 2 * A(k, B * e)			/* logits, dlogits */
		+ A(k, sizeof(double))			/* loss_dev */
		+ A(k, B * sizeof(float))		/* scores_f32 */
		+ A(k, B * sizeof(int32_t));		/* prune_q */
}

/* model.c: one Qwen3 layer's struct acts, one block (alloc_acts); the dense MLP's gu and act
 * when some layer has it */
static size_t qwen3_layer_acts(const struct counter *k, const struct sl_model_config *mc,
			       size_t T, size_t e, size_t s)
{
	bool dense = false;

	for (int l = 0; l < mc->n_layers; l++)
		dense |= !sl_layer_is_moe(mc, l);

	const size_t H = mc->hidden, I = mc->intermediate, nh = mc->n_heads, nkv = mc->n_kv_heads;
	const size_t hd = mc->head_dim, Q = (nh + 2 * nkv) * hd;

	return A(k, T * H * e)				/* xn1 */
		+ A(k, T * s)				/* rstd1 */
		+ 2 * A(k, T * Q * e)			/* qkv, qkvr */
		+ A(k, T * (nh + nkv) * s)		/* rstd_qk */
		+ A(k, T * nh * hd * e)			/* att */
		+ A(k, T * nh * s)			/* lse */
		+ 2 * A(k, T * H * e)			/* h, xn2 */
		+ A(k, T * s)				/* rstd2 */
		+ (dense ? A(k, T * 2 * I * e)		/* gu */
		   + A(k, T * I * e) : 0);		/* act */
}

/* model.c: Qwen3 layers' struct acts, one set per layer or one when checkpointing */
static void count_qwen3(const struct counter *k, const struct sl_model_config *mc, size_t T,
			bool ckpt, size_t e, size_t s, size_t out[SL_PLAN_N])
{
	out[SL_PLAN_ACTS] += (ckpt ? 1 : mc->n_layers) * qwen3_layer_acts(k, mc, T, e, s);
}

/* model_qwen35.c: struct q35_acts of one layer of @kind (alloc_q35_acts); @dense: with the
 * dense MLP's gu and act */
static size_t q35_layer_acts(const struct counter *k, const struct sl_model_config *mc,
			     enum sl_layer_kind kind, bool dense, size_t T, size_t B, size_t e,
			     size_t s, bool aux)
{
	const size_t H = mc->hidden, I = mc->intermediate, nh = mc->n_heads, nkv = mc->n_kv_heads;
	const size_t hd = mc->head_dim, Q = (nh + 2 * nkv) * hd, Pa = (2 * nh + 2 * nkv) * hd;
	const size_t nk = mc->lin_nk, nv = mc->lin_nv, dk = mc->lin_dk, dv = mc->lin_dv;
	const size_t Cc = 2 * nk * dk + nv * dv, P = Cc + nv * dv + 2 * nv;
	size_t b = A(k, T * H * e)			/* xn1 */
		+ A(k, T * s)				/* rstd1 */
		+ 2 * A(k, T * H * e)			/* h, xn2 */
		+ A(k, T * s)				/* rstd2 */
		+ (dense ? A(k, T * 2 * I * e)		/* gu */
		   + A(k, T * I * e) : 0);		/* act */

	if (kind == SL_LAYER_GATED_ATTENTION)
		return b + A(k, T * Pa * e)		/* proj: q | gate, k, v */
			+ A(k, T * Q * e)		/* qkvr */
			+ 3 * A(k, T * nh * hd * e)	/* gate, o, y */
			+ A(k, T * nh * s)		/* lse */
			+ A(k, T * (nh + nkv) * s);	/* rstd_o */
	return b + A(k, T * P * e)			/* proj: qkv | z | b | a */
		+ 2 * A(k, T * Cc * e)			/* cpre, c */
		+ 2 * A(k, T * nk * dk * e)		/* qn, kn */
		+ A(k, T * 2 * nk * s)			/* rqk */
		+ 2 * A(k, T * nv * s)			/* beta, g */
		/* chunk-start states: at most T / 64 + 2B chunks of 64 tokens (2 chunks a row
		 * under context parallel); with aux, the cuda backend's room past them
		 * (gdn_states_extra, cuda/gdn_chunk.cuh aux_floats: a 64-float head, then
		 * delta and diag(Ga) Q S0, 64 x dv floats each, for T / 64 + B chunks) */
		+ A(k, ((T / 64 + 2 * B) * nv * dk * dv +
			(aux ? 64 + 2 * (T / 64 + B) * nv * 64 * dv : 0)) * s)
		+ 2 * A(k, T * nv * dv * e)		/* o, y */
		+ A(k, T * nv * s);			/* rstd_o */
}

/* model_qwen35.c alloc_scratch: the backward's gradient scratch for T tokens */
static size_t q35_scratch(const struct counter *k, const struct sl_model_config *mc, size_t T,
			  size_t e)
{
	const size_t nh = mc->n_heads, nkv = mc->n_kv_heads, hd = mc->head_dim;
	const size_t Q = (nh + 2 * nkv) * hd, Pa = (2 * nh + 2 * nkv) * hd;
	const size_t nk = mc->lin_nk, nv = mc->lin_nv, dk = mc->lin_dk, dv = mc->lin_dv;
	const size_t Cc = 2 * nk * dk + nv * dv, P = Cc + nv * dv + 2 * nv;

	return A(k, T * zmax(P, Pa) * e)		/* gproj */
		+ A(k, T * Cc * e)			/* gc */
		+ 2 * A(k, T * nk * dk * e)		/* gqn, gkn */
		+ 2 * A(k, T * nv * e)			/* gbeta, gg */
		+ 2 * A(k, T * zmax(nv * dv, nh * hd) * e)	/* go, gy */
		+ A(k, T * Q * e)			/* gqkvr */
		+ A(k, T * nh * hd * e);		/* ggate */
}

/*
 * model_qwen35.c (sl_q35_init): every layer's activations by its kind, or with checkpointing one
 * set of each kind (both, whatever the layers are); the norms' effective weights and the
 * backward's scratch.  The ones it uploads through a transient f32 buffer are not counted: that
 * buffer is freed before sl_model_create returns.  The cuda kernels (cuda/gdn.cu, gattn.cu)
 * allocate nothing of their own: the partial rotary table lives in the context's reduction
 * scratch, and the chunked delta rule's backward grows that scratch (counted in compute(),
 * SL_PLAN_WORKSPACE).
 */
static void count_q35(const struct counter *k, const struct sl_model_config *mc, size_t T,
		      size_t B, bool ckpt, size_t e, size_t s, bool aux, size_t out[SL_PLAN_N])
{
	const size_t H = mc->hidden, hd = mc->head_dim;
	size_t acts = 0;

	if (ckpt)
		acts = q35_layer_acts(k, mc, SL_LAYER_GATED_ATTENTION, true, T, B, e, s, aux) +
			q35_layer_acts(k, mc, SL_LAYER_LINEAR_ATTENTION, true, T, B, e, s, aux);
	else
		for (int l = 0; l < mc->n_layers; l++)
			acts += q35_layer_acts(k, mc, mc->layer_kind[l], true, T, B, e, s, aux);
	out[SL_PLAN_ACTS] += acts
		+ A(k, zmax(H, hd) * e)			/* ones */
		+ 3 * A(k, H * e)			/* wn1, wn2, wfin */
		+ 2 * A(k, hd * e)			/* wqn, wkn */
		+ q35_scratch(k, mc, T, e);
}

/*
 * model_qwen35.c's context-parallel state (sl_q35_cp_init, at the first context-parallel
 * micro-batch): the Gated DeltaNet's two passed states of B rows and four buffers of 2B chunks'
 * K-1 convolution edge rows (the gated attention uses model_cp.c's k|v buffers)
 */
static size_t q35_cp(const struct counter *k, const struct sl_model_config *mc, size_t B,
		     size_t e, size_t s)
{
	const size_t nk = mc->lin_nk, nv = mc->lin_nv, dk = mc->lin_dk, dv = mc->lin_dv;
	const size_t P = 2 * nk * dk + 2 * nv * dv + 2 * nv;

	return 2 * A(k, B * nv * dk * dv * s) + 4 * A(k, 2 * B * (mc->lin_conv - 1) * P * e);
}

/*
 * model.c: sl_model_create's workspace for T tokens, B records, by family (Qwen3.5: the config's
 * norm_offset, as model.c decides); SL_PLAN_ACTS and SL_PLAN_HEAD
 */
static void count_model(const struct counter *k, const struct sl_model_config *mc, size_t T,
			size_t B, bool sft, bool ckpt, size_t e, size_t s, bool aux,
			size_t out[SL_PLAN_N])
{
	count_common(k, mc, T, B, sft, e, s, out);
	if (mc->norm_offset)
		count_q35(k, mc, T, B, ckpt, e, s, aux, out);
	else
		count_qwen3(k, mc, T, ckpt, e, s, out);
}

/*
 * shard.c: this rank's shard of unit u, and (@padded) the unit padded to a multiple of the ranks
 * sharing it; an experts' unit split over parallel.expert = P ranks: its 1 / P, over the S / P
 * ranks holding the same experts
 */
static size_t unit_shard(const struct sl_config *c, const struct sl_layout *lay, int S0, int u,
			 size_t *padded)
{
	const int P = lay->unit_experts && lay->unit_experts[u] &&
		c->parallel.expert > 1 ? c->parallel.expert : 1;
	const size_t S = S0 / P > 0 ? (size_t)(S0 / P) : 1;
	const size_t pad = (lay->unit_numel[u] / P + S - 1) / S * S;

	if (padded)
		*padded = pad;
	return pad / S;
}

/* a pool of n unit slots at sl_shard_pool_caps's sizes, in bytes (@caps: its scratch) */
static size_t pool_bytes(const struct counter *k, const size_t *pad, int n_units, int n,
			 size_t e, size_t *caps)
{
	size_t b = 0;

	sl_shard_pool_caps(pad, n_units, n, caps);
	for (int i = 0; i < n; i++)
		b += A(k, caps[i] * e);
	return b;
}

/* the plan with offload's micro-batch accumulation on the device (@accum_dev) or not */
static int compute(const struct sl_config *c, const struct sl_model_config *mc,
		   const struct sl_layout *lay, const struct sl_plan_opts *o, struct sl_plan *p,
		   bool accum_dev, bool lean)
{
	struct counter dk, hk = { .align = 64 };
	size_t e, sum_w = 0, sum_f = 0, sum_hf = 0, sum_hw = 0, T, B, L, Lrow, load, ge, sum_g;
	int n_x = 0;			/* experts' units */
	bool host_state, host_params;
	size_t *pad, *caps;

	memset(p, 0, sizeof(*p));
	if (o->gpus < 1) {
		sl_error("plan: --gpus must be at least 1");
		return -1;
	}
	p->gpus = o->gpus;
	p->node_size = o->node_size > 0 ? o->node_size : c->parallel.node_size > 0 ?
		c->parallel.node_size : (o->gpus < 8 ? o->gpus : 8);
	if (p->node_size > p->gpus)
		p->node_size = p->gpus;
	p->S = c->parallel.shard_group == SL_SHARD_NODE ? p->node_size : p->gpus;
	p->cuda = c->backend == SL_BACKEND_CUDA;
	e = c->precision.compute == SL_PREC_BF16 ? 2 : c->precision.compute == SL_PREC_FP32 ? 4 :
		p->cuda ? 2 : 4;
	p->elt = e;
	p->stat_elt = p->cuda ? 4 : e;		/* cuda keeps stats in float, cpu in compute type */
	dk.align = p->cuda ? 256 : 64;
	p->offload = o->offload >= 0 ? (enum sl_offload)o->offload : c->parallel.offload;
	p->ckpt = o->ckpt >= 0 ? o->ckpt : c->train.activation_checkpointing;
	p->batch = c->train.batch;
	p->seq = c->data.max_state;
	p->gpu_mem = o->gpu_mem;
	p->host_mem = o->host_mem;
	host_state = p->offload != SL_OFFLOAD_NONE;
	host_params = p->offload == SL_OFFLOAD_PARAMS;
	p->lean = lean && p->offload == SL_OFFLOAD_OPTIMIZER;
	p->accum_dev = (accum_dev && host_state && c->train.accum > 1) || p->lean;

	/*
	 * shard.c: per unit, padded to a multiple of S, this rank's shard of it; an experts' unit
	 * split over parallel.expert = P ranks: its 1 / P, over the S / P ranks holding the same
	 * experts
	 */
	/* the units' padded sizes, and sl_shard_pool_caps's room: n_units, or 3 gradient slots */
	pad = malloc(lay->n_units * sizeof(size_t));
	caps = malloc((lay->n_units + 3) * sizeof(size_t));
	if (!pad || !caps) {
		free(pad);
		free(caps);
		sl_error("plan: out of memory");
		return -1;
	}
	for (int u = 0; u < lay->n_units; u++) {
		size_t padded, shard = unit_shard(c, lay, p->S, u, &padded);

		pad[u] = padded;
		p->params += lay->unit_numel[u];
		n_x += lay->unit_experts && lay->unit_experts[u];
		p->shard_elems += shard;
		p->max_padded = zmax(p->max_padded, padded);
		p->max_shard = zmax(p->max_shard, shard);
		sum_w += A(&dk, shard * e);		/* w_shard on the device */
		sum_f += A(&dk, shard * sizeof(float));	/* one of master, m, v, grad32 */
		sum_hf += A(&hk, shard * sizeof(float));	/* the same on the host */
		sum_hw += A(&hk, shard * e);		/* w_shard on the host */
	}
	/* gather slots: none when one rank reads its own device shard in place */
	if (p->S == 1 && !host_params)
		p->n_wslots = 0;
	else if (c->parallel.reshard_after_forward || host_params)
		p->n_wslots = c->parallel.prefetch + 2 < lay->n_units ? c->parallel.prefetch + 2 :
			lay->n_units;
	else
		p->n_wslots = lay->n_units;

	p->dev[SL_PLAN_WEIGHTS] = (host_params ? 0 : sum_w) +
		pool_bytes(&dk, pad, lay->n_units, p->n_wslots, e, caps);
	p->dev[SL_PLAN_OPTIM] = host_state ? 0 : 3 * sum_f;		/* master, m, v */
	p->dev[SL_PLAN_COMM] = (p->S > 1 ? A(&dk, zmin(p->max_padded * sizeof(float),
						       SL_SHARD_RS_STAGE)) : 0) /* g32_full */
		+ (host_state || c->train.accum != 1 ?
		   A(&dk, p->max_shard * sizeof(float)) : 0)		/* rs_out */
		+ A(&dk, lay->n_units * sizeof(double))			/* d_sumsq */
		+ (host_state && !p->lean ? 2 * A(&dk, p->max_shard * sizeof(float)) : 0) /* ring */
		+ (host_params && p->S > 1 ? A(&dk, p->max_shard * e) : 0);	/* d_wstage */
	p->dev[SL_PLAN_WORKSPACE] = p->cuda ? CUDA_WORKSPACE + CUDA_SCRATCH + CUDA_SIDE_SCRATCH : 0;
	p->dev[SL_PLAN_RUNTIME] = p->cuda ? CUDA_CONTEXT : 0;

	/*
	 * model.c at the configured batch and length (context parallel: 1/C of the rows, padded
	 * to a multiple of 2C, as train.c sizes the model); train_batch.c's device batch (whole rows)
	 */
	B = (size_t)p->batch;
	L = (size_t)p->seq;
	p->C = c->parallel.context > 1 ? c->parallel.context : 1;
	/* context.c sl_cp_row_len: a multiple of 2C, at least 4 tokens (SL_CP_MIN_CHUNK) a chunk */
	Lrow = (L + 2 * p->C - 1) / (2 * p->C) * (2 * p->C);
	if (p->C > 1 && Lrow < 8 * (size_t)p->C)
		Lrow = 8 * (size_t)p->C;
	T = B * (Lrow / p->C);
	/* the chunked delta rule's saved forward tiles (backend_cuda_gdn.c gdn_states_extra) */
	p->gdn_aux = p->cuda && mc->norm_offset && mc->lin_nv && !o->no_gdn_aux;
	count_model(&dk, mc, T, B, !sl_layout_find(lay, "score.weight"), p->ckpt, e,
		    p->stat_elt, p->gdn_aux, p->dev);
	/*
	 * cuda/gdn_chunk.cu: the chunked delta rule's backward grows the context's scratch to hold,
	 * for every chunk of the micro-batch (at most T / 64 + B), dS at its end for all value heads,
	 * dq, dk in fp32 for all key heads, k_gdn_prep's slot for every value head (W, X, P, T,
	 * A and G: 64 x (dk + dv + 3 x 64) + 64 floats) and k_gdn_grad_v's (dW, dP, dT and the rows'
	 * sums: 64 x (dk + 2 x 64 + 8)), when the device has room (else it runs in waves within
	 * what it has); the three-pass forward needs smaller slots alone
	 */
	if (p->cuda && mc->lin_nv) {
		size_t nch = T / 64 + B;
		size_t dst = nch * ((mc->lin_nv * mc->lin_dv + 2 * 64 * mc->lin_nk) * mc->lin_dk +
				    mc->lin_nv * (64 * (size_t)(2 * mc->lin_dk + mc->lin_dv + 328) +
						  64)) *
			     sizeof(float);

		if (dst > CUDA_SCRATCH)
			p->dev[SL_PLAN_WORKSPACE] += dst - CUDA_SCRATCH;
	}
	p->dev[SL_PLAN_HEAD] += A(&dk, B * L * sizeof(int32_t)) +	/* ids */
		3 * A(&dk, B * sizeof(int32_t)) +		/* lens, last, labels */
		3 * A(&dk, B * L * sizeof(int32_t));		/* tgt_pos, tgt_ids, pos */
	if (p->C > 1) {
		const size_t CT = p->C * T, kw = 2 * (size_t)mc->n_kv_heads * mc->head_dim;

		/* model_cp.c: 3 k|v buffers of whole rows; model_qwen35.c's passed DeltaNet state */
		p->dev[SL_PLAN_ACTS] += 3 * A(&dk, CT * kw * e) +
			(mc->norm_offset ? q35_cp(&dk, mc, B, e, p->stat_elt) : 0);
		/* context.c's context-parallel batch: 7 index rows, 3 per-record arrays and the
		 * rows' lengths in the rank's 2 chunks */
		p->dev[SL_PLAN_HEAD] += 7 * A(&dk, B * Lrow * sizeof(int32_t)) +
			3 * A(&dk, B * sizeof(int32_t)) + A(&dk, 2 * B * sizeof(int32_t));
	}
	/*
	 * shard.c: grad32 (or offload's d_acc); with grad_direct (one GPU, one micro-batch a step,
	 * state on the GPU) gradients in the compute type where the backward writes them, no
	 * slots.  With one micro-batch a step and the activations kept, a Qwen3 layer unit's
	 * gradient lives in a layer's activations when they are large enough.
	 */
	p->grad_direct = p->gpus == 1 && !host_state && c->train.accum == 1;
	ge = p->grad_direct ? e : sizeof(float);
	sum_g = p->grad_direct ? sum_w : sum_f;
	if (!host_state && c->train.accum == 1 && !p->ckpt && !mc->norm_offset) {
		size_t room = qwen3_layer_acts(&dk, mc, T, e, p->stat_elt);

		/*
		 * model.c sl_model_grad_room: unit u = 1 + l's fp32 shard in layer l's
		 * activations; with grad_direct, written while the unit's backward runs, unit
		 * u's in layer u's: the embedding's too (not tied: the head writes it first),
		 * not the last layer's
		 */
		const bool tied = !sl_layout_find(lay, "score.weight") &&
			!sl_layout_find(lay, "lm_head.weight");

		for (int u = p->grad_direct ? 0 : 1; u <= mc->n_layers - p->grad_direct; u++) {
			size_t sh = unit_shard(c, lay, p->S, u, NULL) * ge;

			if (p->grad_direct && u == 0 && tied)
				continue;

			if (sh <= room) {
				sum_g -= A(&dk, sh);
				p->lent_grads += sh;
			}
		}
	}
	p->dev[SL_PLAN_GRADS] = pool_bytes(&dk, pad, lay->n_units,	/* gslots */
					   p->grad_direct ? 0 : n_x ? 3 : 2, e, caps) +
		(!host_state || p->accum_dev ? sum_g : 0) +	/* grad32 (gradc), or d_acc */
		(p->lean ? A(&dk, lay->n_units * sizeof(double)) : 0);	/* per-unit sumsq */
	for (int i = 0; i < SL_PLAN_N; i++)
		p->dev_total += p->dev[i];

	/* host, per rank: the offloaded state */
	p->host[SL_PLAN_OPTIM] = host_state ? 3 * sum_hf : 0;
	/* grad32, and the ring's host half when later micro-batches add up on the host; lean:
	 * the gradient ring only */
	p->host[SL_PLAN_GRADS] = p->lean ? 2 * A(&hk, p->max_shard * sizeof(float)) :
		host_state ? sum_hf + (c->train.accum > 1 && !p->accum_dev ?
				       2 * A(&hk, p->max_shard * sizeof(float)) : 0) : 0;
	/* w_host: the compute copy AdamW writes (with params the only copy); lean: a ring */
	p->host[SL_PLAN_WEIGHTS] = p->lean ? 2 * A(&hk, p->max_shard * e) :
		host_state ? sum_hw : 0;
	/*
	 * Transient: a checkpoint copies master, m and v of every unit to host buffers (train_run.c);
	 * loading holds one whole unit in fp32 at a time.  They never overlap: count the larger.
	 */
	load = 0;
	for (int u = 0; u < lay->n_units; u++)
		load = zmax(load, lay->unit_numel[u] * sizeof(float));
	p->host[SL_PLAN_CKPT] = zmax(c->checkpoint.every > 0 ? 3 * p->shard_elems * sizeof(float)
				     : 0, load);
	for (int i = 0; i < SL_PLAN_N; i++)
		p->host_rank += p->host[i];
	if (!p->cuda)
		p->host_rank += p->dev_total;	/* the cpu backend's "device" is host memory */
	p->host_node = p->host_rank * (size_t)p->node_size;

	p->gpu_fits = !p->cuda || !p->gpu_mem || p->dev_total <= p->gpu_mem;
	p->host_fits = !p->host_mem || p->host_node <= p->host_mem;
	free(pad);
	free(caps);
	return 0;
}

/*
 * With offload and accum > 1, earlier micro-batches' gradients add up on the GPU when they fit
 * there (no host traffic until the step's last micro-batch), else on the host.
 */
int sl_plan_compute(const struct sl_config *c, const struct sl_model_config *mc,
		    const struct sl_layout *lay, const struct sl_plan_opts *o, struct sl_plan *p)
{
	struct sl_plan q;

	if (o->force_lean)
		return compute(c, mc, lay, o, p, true, true);
	if (compute(c, mc, lay, o, p, true, false))
		return -1;
	if (p->accum_dev && !p->gpu_fits && compute(c, mc, lay, o, p, false, false))
		return -1;
	/* a host too small for gradients and the bf16 copy: keep those on the GPU (host_lean) */
	if (!p->host_fits && p->offload == SL_OFFLOAD_OPTIMIZER &&
	    compute(c, mc, lay, o, &q, true, true) == 0 && sl_plan_fits(&q))
		*p = q;
	/* the delta rule's saved tiles where only they do not fit: the run goes without them */
	if (p->gdn_aux && !p->gpu_fits) {
		struct sl_plan_opts o2 = *o;

		o2.no_gdn_aux = true;
		if (sl_plan_compute(c, mc, lay, &o2, &q) == 0 && sl_plan_fits(&q)) {
			*p = q;
			p->gdn_aux_dropped = true;
		}
	}
	return 0;
}

bool sl_plan_fits(const struct sl_plan *p)
{
	return p->gpu_fits && p->host_fits;
}

double sl_plan_parse_mem(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || !(v > 0) || !isfinite(v))
		return -1;
	if (!*end || !strcasecmp(end, "GB") || !strcasecmp(end, "G"))
		return v * 1e9;
	if (!strcasecmp(end, "GiB"))
		return v * GIB;
	return -1;
}

static double gib(size_t b)
{
	return b / GIB;
}

/* A variant of the config: offload and checkpointing as given, or more GPUs. */
static bool variant_fits(const struct sl_config *c, const struct sl_model_config *mc,
			 const struct sl_layout *lay, const struct sl_plan_opts *o, int offload,
			 int ckpt, int gpus)
{
	struct sl_plan_opts v = *o;
	struct sl_plan q;

	v.offload = offload;
	v.ckpt = ckpt;
	v.gpus = gpus;
	return sl_plan_compute(c, mc, lay, &v, &q) == 0 && sl_plan_fits(&q);
}

/* Settings that would make it fit, least intrusive first. */
static void print_advice(const struct sl_plan *p, const struct sl_config *c,
			 const struct sl_model_config *mc, const struct sl_layout *lay,
			 const struct sl_plan_opts *o, FILE *out)
{
	static const struct { int offload, ckpt; const char *what; } tries[] = {
		{ SL_OFFLOAD_NONE, 1, "train.activation_checkpointing: true" },
		{ SL_OFFLOAD_OPTIMIZER, -1, "parallel.offload: optimizer" },
		{ SL_OFFLOAD_OPTIMIZER, 1,
		  "parallel.offload: optimizer and train.activation_checkpointing: true" },
		{ SL_OFFLOAD_PARAMS, -1, "parallel.offload: params" },
		{ SL_OFFLOAD_PARAMS, 1,
		  "parallel.offload: params and train.activation_checkpointing: true" },
	};
	int n = 0, cur_ckpt = p->ckpt;

	fprintf(out, "to make it fit, set one of:\n");
	for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
		int ck = tries[i].ckpt < 0 ? cur_ckpt : tries[i].ckpt;

		/* never undo a setting; with checkpointing on, the "keep" entries cover it */
		if ((int)tries[i].offload < (int)p->offload || (cur_ckpt && tries[i].ckpt == 1) ||
		    ((int)tries[i].offload == (int)p->offload && ck == cur_ckpt))
			continue;
		if (variant_fits(c, mc, lay, o, tries[i].offload, ck, p->gpus)) {
			fprintf(out, "  %s\n", tries[i].what);
			n++;
		}
	}
	if (c->parallel.shard_group == SL_SHARD_WORLD) {
		for (int g = p->gpus + 1; g <= 4096; g++) {
			if (variant_fits(c, mc, lay, o, p->offload, cur_ckpt, g)) {
				fprintf(out, "  more GPUs: %d (FSDP shards the state over them; "
					"records per step grow with the data-parallel ranks)\n", g);
				n++;
				break;
			}
		}
	} else {
		fprintf(out, "  (parallel.shard_group: node keeps a whole copy of the state per "
			"node; shard_group: world spreads it over every GPU)\n");
	}
	if (!n)
		fprintf(out, "  nothing tried fits (offload, checkpointing, up to 4096 GPUs): a "
			"shorter data.max_state or a smaller train.batch, or more host memory\n");
}

void sl_plan_print(const struct sl_plan *p, const struct sl_config *c,
		   const struct sl_model_config *mc, const struct sl_layout *lay,
		   const struct sl_plan_opts *o, FILE *out)
{
	fprintf(out, "plan for %s: %s, %d layers, hidden %d, %.3f B parameters\n", c->source,
		mc->model_type, mc->n_layers, mc->hidden, p->params / 1e9);
	fprintf(out, "  %d GPU(s), %d per node, shard group of %d (%s); backend %s, compute "
		"%zu-byte elements; batch %d x %d tokens (data.max_state); activation "
		"checkpointing %s; offload %s; prefetch %d\n", p->gpus, p->node_size, p->S,
		c->parallel.shard_group == SL_SHARD_NODE ? "HSDP" : "FSDP",
		sl_backend_name(c->backend), p->elt, p->batch, p->seq, p->ckpt ? "on" : "off",
		sl_offload_name(p->offload), c->parallel.prefetch);
	fprintf(out, "  sizes in GiB (2^30 bytes); --gpu-mem and --host-mem read GB (10^9 bytes) "
		"unless written 80GiB\n\n");
	fprintf(out, "%-28s %12s %14s\n", p->cuda ? "per GPU" : "per rank (device)", "GiB",
		"bytes");
	for (int i = 0; i < SL_PLAN_N; i++)
		if (i != SL_PLAN_CKPT && (p->dev[i] || i < SL_PLAN_WORKSPACE))
			fprintf(out, "  %-26s %12.2f %14zu\n", cat_name[i], gib(p->dev[i]),
				p->dev[i]);
	fprintf(out, "  %-26s %12.2f %14zu\n", "total", gib(p->dev_total), p->dev_total);
	fprintf(out, "  (weights: %d gathered unit(s) in flight, slots the size of the largest "
		"units, up to %zu elements; "
		"activations for %d x %d tokens%s%s)\n", p->n_wslots, p->max_padded, p->batch,
		p->seq, p->C > 1 ? " (this rank's 1/C of each row, and whole rows' k|v,"
		" with context parallel)" : "",
		!p->ckpt ? "" : mc->norm_offset ? ", one set per layer kind with "
		"checkpointing" : ", one layer's set with checkpointing");
	if (p->gdn_aux_dropped)
		fprintf(out, "  (activations: without the Gated DeltaNet forward's delta and Q S0 "
			"tiles for the backward, which do not fit: a slower backward)\n");
	if (p->grad_direct)
		fprintf(out, "  (gradients: one GPU, one micro-batch a step: in %zu-byte elements "
			"where the backward writes them, no fp32 copy)\n", p->elt);
	if (p->lent_grads)
		fprintf(out, "  (gradients: %.2f GiB of them live in layers' activations, which "
			"the backward is done with: one micro-batch a step)\n", gib(p->lent_grads));
	for (int l = 0; l < mc->n_layers; l++) {
		if (sl_layer_is_moe(mc, l)) {
			fprintf(out, "  (not counted yet: the mixture-of-experts layers' routing "
				"buffers and expert activations, model_moe.c)\n");
			break;
		}
	}
	if (p->lean)
		fprintf(out, "  (offload, lean host: the host has no room for gradients and a bf16 "
			"copy, so fp32 gradients stay on the GPU (in gradients) and stream through the "
			"host during the update)\n");
	else if (p->offload != SL_OFFLOAD_NONE && c->train.accum > 1)
		fprintf(out, "  (offload, accum %d: earlier micro-batches' gradients add up %s)\n",
			c->train.accum, p->accum_dev ? "on the GPU, in fp32 (in gradients)" :
			"in host memory: no room for them on the GPU");
	fprintf(out, "\n");
	fprintf(out, "%-28s %12s %14s\n", "host, per rank", "GiB", "bytes");
	for (int i = 0; i < SL_PLAN_N; i++)
		if (p->host[i] || i == SL_PLAN_OPTIM)
			fprintf(out, "  %-26s %12.2f %14zu%s\n", cat_name[i], gib(p->host[i]),
				p->host[i], i == SL_PLAN_CKPT ? "  (transient)" : "");
	if (!p->cuda)
		fprintf(out, "  %-26s %12.2f %14zu\n", "device buffers (cpu)", gib(p->dev_total),
			p->dev_total);
	fprintf(out, "  %-26s %12.2f %14zu\n", "total", gib(p->host_rank), p->host_rank);
	fprintf(out, "  %-26s %12.2f %14zu  (%d rank(s))\n\n", "per node", gib(p->host_node),
		p->host_node, p->node_size);

	if (p->cuda && p->gpu_mem)
		fprintf(out, "GPU: %.2f GiB of %.2f GiB (%.0f GB): %s\n", gib(p->dev_total),
			p->gpu_mem / GIB, p->gpu_mem / 1e9, p->gpu_fits ? "fits" : "DOES NOT FIT");
	else if (p->cuda)
		fprintf(out, "GPU: %.2f GiB: not checked (no --gpu-mem)\n", gib(p->dev_total));
	if (p->host_mem)
		fprintf(out, "host: %.2f GiB per node of %.2f GiB (%.0f GB): %s\n",
			gib(p->host_node), p->host_mem / GIB, p->host_mem / 1e9,
			p->host_fits ? "fits" : "DOES NOT FIT");
	else
		fprintf(out, "host: %.2f GiB per node: not checked (no --host-mem)\n",
			gib(p->host_node));
	fprintf(out, "verdict: %s\n", sl_plan_fits(p) ? "fits" : "does not fit");
	if (!sl_plan_fits(p))
		print_advice(p, c, mc, lay, o, out);
}

/*
 * This node's physical memory (bytes), 0 when unknown.  SHARDLM_HOST_MEM (as --host-mem) wins:
 * a virtual machine whose memory grows as it is used reads a small MemTotal at the start.
 */
static double node_memory(void)
{
	FILE *f;
	char line[256];
	double kb = 0;
	const char *e = getenv("SHARDLM_HOST_MEM");

	if (e && *e && sl_plan_parse_mem(e) > 0)
		return sl_plan_parse_mem(e);
	f = fopen("/proc/meminfo", "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %lf kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

int sl_plan_check_job(const struct sl_config *c, int world, int node_size, double gpu_bytes,
		      bool *accum_dev, bool *lean, int *gdn_aux)
{
	struct sl_model_files mf;
	struct sl_plan_opts o = { .gpus = world, .node_size = node_size, .gpu_mem = gpu_bytes,
				  .host_mem = node_memory(), .offload = -1, .ckpt = -1 };
	struct sl_plan p;
	int ret = -1;

	if (sl_model_files_open(&mf, c->model.path, c->model.revision, c->task))
		return -1;
	if (sl_plan_compute(c, &mf.mc, &mf.lay, &o, &p))
		goto out_close;
	ret = 0;
	*accum_dev = p.accum_dev;
	*lean = p.lean;
	*gdn_aux = p.gdn_aux ? 1 : p.gdn_aux_dropped ? -1 : 0;
	if (!sl_plan_fits(&p)) {
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);

		sl_plan_print(&p, c, &mf.mc, &mf.lay, &o, f);
		fclose(f);
		sl_error("%s does not fit in memory (host: %.2f GiB per node of %.2f GiB here%s); "
			 "refused before loading anything (a machine whose MemTotal understates its "
			 "memory: set SHARDLM_HOST_MEM, e.g. 128GB).  The plan (shardlm plan %s "
			 "--gpus %d):\n%s", c->source, gib(p.host_node), o.host_mem / GIB,
			 p.gpu_fits ? "" : "; GPU too", c->source, world, buf);
		free(buf);
		ret = -1;
	}
out_close:
	sl_model_files_close(&mf);
	return ret;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: shardlm plan CONFIG [--set KEY=VALUE]... [--gpus N] [--gpu-mem GB] "
		"[--host-mem GB]\n"
		"  --gpus N       ranks (one per GPU), default 1\n"
		"  --gpu-mem GB   memory per GPU, default 80 (an H100); 141 for an H200; GB = "
		"10^9 bytes, or write 79.6GiB\n"
		"  --host-mem GB  memory per node; not checked when absent\n"
		"Sizes are reported in GiB (2^30 bytes).  Exit status: 0 fits, 1 does not fit, "
		"2 error.\n");
}

int sl_cmd_plan(int argc, char **argv)
{
	struct sl_config *c = calloc(1, sizeof(*c));
	struct sl_model_files mf;
	struct sl_plan_opts o = { .gpus = 1, .gpu_mem = 80e9, .offload = -1, .ckpt = -1 };
	struct sl_plan p;
	const char *config = NULL;
	char *set[256];
	int nset = 0, ret = 2;

	if (!c)
		return 2;
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
			usage(stdout);
			ret = 0;
			goto out_free;
		}
		if (!strcmp(s, "--set") || !strcmp(s, "--gpus") || !strcmp(s, "--gpu-mem") ||
		    !strcmp(s, "--host-mem")) {
			if (!v) {
				sl_error("%s needs a value", s);
				goto out_usage;
			}
			i++;
			if (!strcmp(s, "--set")) {
				if (nset == 256 || !strchr(v, '=')) {
					sl_error("--set needs KEY=VALUE (at most 256)");
					goto out_usage;
				}
				set[nset++] = (char *)v;
			} else if (!strcmp(s, "--gpus")) {
				char *end;
				long n = strtol(v, &end, 10);

				if (*end || n < 1 || n > 1 << 20) {
					sl_error("--gpus %s: expected a positive integer", v);
					goto out_usage;
				}
				o.gpus = (int)n;
			} else {
				double b = sl_plan_parse_mem(v);

				if (b < 0) {
					sl_error("%s %s: expected a size in GB (e.g. 80, 141GB or "
						 "79.6GiB)", s, v);
					goto out_usage;
				}
				*(!strcmp(s, "--gpu-mem") ? &o.gpu_mem : &o.host_mem) = b;
			}
			continue;
		}
		if (s[0] == '-' || config) {
			sl_error(s[0] == '-' ? "unknown option %s for 'plan'" :
				 "one config file only (%s)", s);
			goto out_usage;
		}
		config = s;
	}
	if (!config) {
		sl_error("no config file given");
		goto out_usage;
	}
	if (sl_config_load(c, config, set, nset, false))
		goto out_free;
	if (!c->model.path[0]) {
		sl_error("%s: model.path is not set: the planner reads the model's config.json",
			 config);
		goto out_free;
	}
	if (sl_model_files_open(&mf, c->model.path, c->model.revision, c->task))
		goto out_free;
	if (sl_plan_compute(c, &mf.mc, &mf.lay, &o, &p) == 0) {
		sl_plan_print(&p, c, &mf.mc, &mf.lay, &o, stdout);
		ret = sl_plan_fits(&p) ? 0 : 1;
	}
	sl_model_files_close(&mf);
	goto out_free;

out_usage:
	usage(stderr);
out_free:
	free(c);
	return ret;
}
