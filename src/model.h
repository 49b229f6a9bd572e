/*
 * model: the model families.
 *
 * model_config.c: shapes from a Hugging Face config.json (struct sl_model_config) and the parameter
 * layout (struct sl_layout: every tensor's HF name, shape, unit and offset in its unit).
 * model.c: forward and backward, written once against struct sl_backend, with activation
 * checkpointing.  It knows nothing about ranks, MPI, files or data formats: weights arrive through
 * struct sl_unit_source (the shard module provides it), batches as device buffers.
 *
 * Units (the FSDP granularity): unit 0 = embedding, unit 1 + l = decoder layer l,
 * unit n_layers + 1 = final norm + head, then one unit per MoE layer holding its experts, expert
 * after expert (expert parallelism splits such a unit by experts, shard.c).  Inside a layer unit the tensors are laid out so that
 * fused GEMMs need no copies: q_proj, k_proj, v_proj weights are contiguous (one (nh+2nkv)hd x H
 * matrix), as are their biases, and gate_proj, up_proj (one 2I x H matrix).
 */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

enum sl_layer_kind {
	SL_LAYER_FULL_ATTENTION,	/* Qwen3 attention: q/k norm, rope, GQA */
	SL_LAYER_GATED_ATTENTION,	/* Qwen3.5 full_attention: + output gate, partial rope */
	SL_LAYER_LINEAR_ATTENTION,	/* Qwen3.5 linear_attention: Gated DeltaNet */
};

enum sl_mlp_kind {
	SL_MLP_DENSE,			/* SwiGLU */
	SL_MLP_MOE,			/* Qwen3-MoE: softmax router, top-k SwiGLU experts (+ the
					 * gated shared expert of Qwen3.5-MoE) */
};

struct sl_model_config {
	char model_type[64];		/* "qwen3" */
	char architecture[128];		/* architectures[0] of config.json, "" if absent */
	int vocab;
	int hidden;			/* H */
	int n_layers;
	int n_heads;			/* nh */
	int n_kv_heads;			/* nkv; nh % nkv == 0 */
	int head_dim;			/* hd; independent of H / nh */
	int intermediate;		/* I */
	int max_position;
	double rms_eps;
	double rope_theta;
	bool attention_bias;		/* q, k, v, o projections carry biases */
	bool tie_word_embeddings;
	double initializer_range;
	int pad_token_id;		/* -1 if absent */
	int bos_token_id;		/* -1 if absent */
	int eos_token_id;		/* -1 if absent */
	int num_labels;			/* 1 for the scalar head */
	/* Qwen3.5 hybrid (qwen3_5_text, qwen3_5): 0 elsewhere */
	bool norm_offset;		/* RMSNorms scale by (1 + weight) (zero-centred weights) */
	int rot_dim;			/* rotated dims of a head: head_dim * partial_rotary_factor */
	int lin_nk, lin_nv;		/* Gated DeltaNet key / value heads; nv % nk == 0 */
	int lin_dk, lin_dv;		/* their dims */
	int lin_conv;			/* linear_conv_kernel_dim */
	enum sl_layer_kind *layer_kind;	/* (n_layers) */
	enum sl_mlp_kind *mlp_kind;	/* (n_layers) */
	/* mixture of experts (qwen3_moe); 0 / false elsewhere */
	int n_experts;			/* E: num_experts (num_local_experts) */
	int top_k;			/* k: num_experts_per_tok */
	int moe_intermediate;		/* Im: each expert's intermediate size */
	bool norm_topk_prob;		/* renormalize the k routing weights to sum 1 */
	double router_aux_loss_coef;	/* weight of the load-balancing loss; 0: none */
	/* Qwen3.5-MoE (qwen3_5_moe, qwen3_5_moe_text): every MoE layer also has a shared
	 * expert, a SwiGLU MLP of this intermediate size times sigmoid(shared_expert_gate(x));
	 * 0 elsewhere */
	int shared_intermediate;	/* Is: shared_expert_intermediate_size */
};

/* Layer l's MLP is a mixture of experts (a config without per-layer kinds is all dense). */
static inline bool sl_layer_is_moe(const struct sl_model_config *mc, int l)
{
	return mc->mlp_kind && mc->mlp_kind[l] == SL_MLP_MOE;
}

/*
 * Parse config.json (a Hugging Face model config).  Accepts both the top-level rope_theta of hub
 * checkpoints and the rope_parameters object newer transformers writes.  Errors name @path and the
 * key, print to stderr, and return a negative value.
 */
int sl_model_config_load(struct sl_model_config *mc, const char *path);
void sl_model_config_free(struct sl_model_config *mc);

enum sl_init { SL_INIT_NONE, SL_INIT_NORMAL, SL_INIT_ONES, SL_INIT_ZEROS };

struct sl_tensor_info {
	char name[160];			/* HF name, e.g. "model.layers.0.mlp.up_proj.weight" */
	int unit;
	size_t offset;			/* elements from the start of its unit */
	int ndim;			/* 1 or 2 */
	int64_t shape[2];
	size_t numel;
	bool decay;			/* weight decay applies (ndim >= 2) */
	bool head;			/* optim.head_lr_mult applies */
	bool optional;			/* may be absent from a checkpoint (the head) */
	bool unsqueeze1;		/* HF stores it as (shape[0], 1, shape[1]): a Conv1d weight */
	enum sl_init init;		/* how to initialize when absent */
};

struct sl_layout {
	int n_tensors;
	struct sl_tensor_info *t;	/* (n_tensors), ordered by unit then offset */
	int n_units;
	size_t *unit_numel;		/* (n_units) */
	int *unit_experts;		/* (n_units) experts of an experts' unit (the layer's
					 * experts, one after another), 0 for other units */
	size_t total_numel;
};

/* task: 0 = classify (score.weight head), 1 = sft (causal-LM head); config.h's enum sl_task */
int sl_model_layout(const struct sl_model_config *mc, int task, struct sl_layout *lay);
void sl_layout_free(struct sl_layout *lay);
const struct sl_tensor_info *sl_layout_find(const struct sl_layout *lay, const char *name);

/* Parameters that count for MFU: every matrix multiply (heads included, embedding excluded). */
double sl_model_matmul_params(const struct sl_model_config *mc, const struct sl_layout *lay);
/*
 * FLOPs of the token mixers for one record of n tokens, forward and backward (MFU): causal
 * attention in full-attention layers (QK^T and PV, 2 hd n(n+1)/2 multiply-adds each per head,
 * times 3), the gated delta rule in linear-attention layers (three dk x dv matrix-vector products
 * per token and value head, times 3).
 */
double sl_model_mixer_flops(const struct sl_model_config *mc, double n);

/*
 * Where the model gets units from.  weights(u) returns the full unit in compute precision, ready
 * (all-gathered, uploaded); grads(u) the buffer (compute type, unit_numel[u] elements) its
 * gradients accumulate into.  release_*() say when the model is done with a unit in the forward and
 * when the unit's gradients are complete for this micro-batch.  Hooks may be NULL.
 */
struct sl_unit_source {
	void *ctx;
	const void *(*weights)(void *ctx, int unit);
	void *(*grads)(void *ctx, int unit);
	void (*release_fwd)(void *ctx, int unit);
	void (*release_bwd)(void *ctx, int unit);
	/* optional (NULL: none): grads without zeroing first, for a caller that writes every
	 * element of the unit (what lies past the unit's elements is zeros) */
	void *(*grads_set)(void *ctx, int unit);
};

/*
 * Context parallel (parallel.context = C > 1): the collectives the model needs over the C ranks
 * that share a micro-batch, filled in by whoever knows the ranks (context.c); the model calls
 * them around attention.  Buffers are the backend's, counts in compute elements.
 * kv_all_gather: recv(C * count) = every rank's send(count), in rank order.
 * kv_reduce_scatter: recv(count) = the sum over ranks of send[rank * count, (rank + 1) * count).
 * kv_all_gather_start / _wait: the same all-gather in two halves, so that work can run while it
 * travels (recv is complete, and send may change, only after the wait).
 * sum_f64: buf(n), host doubles, summed over the ranks in place (MoE routing statistics).
 * sendrecv: send(bytes) to context rank @to while recv(bytes) comes from rank @from (either -1:
 * none), backend buffers; the Qwen3.5 family passes the Gated DeltaNet state and the
 * convolution's edge rows from chunk to chunk with it.
 */
struct sl_context_comm {
	void *ctx;
	void (*kv_all_gather)(void *ctx, void *recv, const void *send, size_t count);
	void (*kv_all_gather_start)(void *ctx, void *recv, const void *send, size_t count);
	void (*kv_all_gather_wait)(void *ctx);
	void (*kv_reduce_scatter)(void *ctx, void *recv, const void *send, size_t count);
	void (*sum_f64)(void *ctx, double *buf, size_t n);
	void (*sendrecv)(void *ctx, const void *send, int to, void *recv, int from, size_t bytes);
	int rank, size;			/* in the context group */
};

/*
 * A context-parallel micro-batch (model_cp.c): each row of L tokens is cut into 2C chunks, this
 * rank holding chunks rank and 2C-1-rank (Lc = L / C tokens per row, in that order), so every
 * rank has as much causal attention work.  The batch's B, L are then B, Lc; ids, tgt_* and last
 * index local tokens; lens stays the rows' true lengths (global).
 */
struct sl_cp_batch {
	const struct sl_context_comm *comm;
	int L;				/* the rows' full padded length, a multiple of 2C */
	const int32_t *gidx;		/* (B*Lc) each local token's index in its row */
	const int32_t *pos;		/* (B*Lc) its position in its document (rotary, mask) */
	const int32_t *perm;		/* (B*L) row token b*L+i -> its row in the gathered
					 * (C, B*Lc) blocks */
	const int32_t *inv;		/* (C*B*Lc) the inverse: gathered row -> b*L+i */
	const int32_t *clens;		/* (2B) each row's true length within this rank's first
					 * chunk (B), then within its second (B): 0..L/(2C) */
	int n_last;			/* classify: records whose last token is here (the head
					 * rows; last and labels hold n_last entries) */
};

/* One micro-batch in device memory.  */
struct sl_batch_dev {
	int B, L;			/* records, padded length */
	const int32_t *ids;		/* (B*L) token ids, padded positions hold any valid id */
	const int32_t *lens;		/* (B) true lengths, 1..L */
	const int32_t *last;		/* (B) b*L + lens[b] - 1: each record's last token */
	const float *labels;		/* (B) soft labels in [0,1]; NULL for scoring */
	const int32_t *h_lens;		/* (B) the same lengths on the host (for FLOP counts) */
	const int32_t *pos;		/* (B*L) packed rows: position in the document; NULL: t % L
					 * (backend.h) */
	/* sft */
	int n_tgt;			/* target tokens in the micro-batch */
	const int32_t *tgt_pos;		/* (n_tgt) b*L + p: the token whose logits predict a target */
	const int32_t *tgt_ids;		/* (n_tgt) the target ids (of tokens b*L + p + 1) */
	const struct sl_cp_batch *cp;	/* context parallel; NULL: whole rows here */
};

struct sl_model;

/* Workspace for micro-batches of up to max_tokens tokens and max_records records. */
struct sl_model *sl_model_create(const struct sl_model_config *mc, const struct sl_layout *lay,
				 struct sl_backend *be, int max_tokens, int max_records,
				 bool activation_checkpointing);
void sl_model_destroy(struct sl_model *m);

/*
 * Forward and backward of one micro-batch.  sft (a layout with lm_head.weight or tied
 * embeddings and no score.weight): the loss is the cross-entropy of every target (b->tgt_*),
 * its gradient scaled by @loss_scale (1 / targets in the optimizer step); *loss_sum = the
 * unscaled sum of the micro-batch's target cross-entropies; @scores must be NULL.
 * classify: as follows.  Gradients accumulate into
 * src->grads(u); the loss is BCE-with-logits, its gradient scaled by @loss_scale (1 / records in
 * the optimizer step).  *loss_sum (host) = unscaled sum of the micro-batch's BCE values.
 * With MoE layers and a non-zero router_aux_loss_coef, the load-balancing loss of the micro-batch
 * (transformers' load_balancing_loss_func over its real tokens and every MoE layer) is added as
 * coef * aux per record (classify) or per target (sft) of the micro-batch, its gradient scaled
 * alike: the step's loss gets coef * aux as transformers' does when one micro-batch holds the
 * step (several micro-batches: their aux losses weighted by records or targets).
 * sl_model_lm_loss (evaluation) leaves it out: the cross-entropy only.
 * @scores (host, B) gets the logits when non-NULL.
 */
int sl_model_train_step(struct sl_model *m, const struct sl_unit_source *src,
			const struct sl_batch_dev *b, float loss_scale, double *loss_sum,
			float *scores);

/* sft, forward only: *loss_sum = sum of the targets' cross-entropies (validation). */
int sl_model_lm_loss(struct sl_model *m, const struct sl_unit_source *src,
		     const struct sl_batch_dev *b, double *loss_sum);

/* sft: compute the logits in chunks of at most @rows rows (>= 1; at most the default, which
 * keeps a chunk's logits near 256 MiB).  For tests of the chunking. */
void sl_model_set_lm_chunk(struct sl_model *m, int rows);

/* true when the model's head is the causal-LM head (task sft) */
bool sl_model_is_lm(const struct sl_model *m);

/* classify, forward only: logits (host, B). */
int sl_model_score(struct sl_model *m, const struct sl_unit_source *src,
		   const struct sl_batch_dev *b, float *scores);

/*
 * Mixture of experts: after sl_model_train_step or sl_model_score, the tokens each expert received
 * in the last micro-batch (real tokens only, each counted once per expert it chose), as
 * (*n_layers) x (*n_experts) values, row i for the i-th MoE layer (in layer order); NULL when the
 * model has no MoE layer.  *aux (when non-NULL): that micro-batch's load-balancing loss (without
 * router_aux_loss_coef).
 */
const int64_t *sl_model_expert_counts(const struct sl_model *m, int *n_layers, int *n_experts,
				      double *aux);

/*
 * Expert parallelism (model_moe_ep.c).  The model knows no ranks: the trainer passes the expert
 * group as callbacks.  Rank r of a group of P owns experts [r E/P, (r+1) E/P) of every MoE layer;
 * after routing, each choice's row goes to its expert's owner (all-to-all), the owner runs its
 * experts and sends the outputs back, combined in order.  Every rank of the group must run the
 * same layers in lockstep (same micro-batch count).  capacity_factor > 0 also caps every
 * expert at ceil(cf * N k / E) choices of the micro-batch's N real tokens on each rank (the
 * later tokens dropped: their expert output is 0; choices of padding are never sent).
 * With P > 1 the unit source's experts' units hold only the rank's E/P experts (shard.c), which
 * the model indexes from 0.
 */
struct sl_moe_dispatch {
	int rank, size;			/* this rank's index in the expert group; its ranks (P) */
	double capacity_factor;		/* 0: no choice dropped */
	void *ctx;
	/* n ints to each rank: recv (P n) = rank q's send[rank n, (rank + 1) n), in q order */
	void (*counts)(void *ctx, const int *send, int *recv, int n);
	/* rows of @row_bytes: scount[q] consecutive rows of send to rank q (q order),
	 * rcount[q] from q into recv (q order); backend buffers */
	void (*rows)(void *ctx, const void *send, const int *scount, void *recv,
		     const int *rcount, size_t row_bytes);
};
/* NULL (the default): every expert runs locally on every token.  Returns 0, or negative with a
 * message (experts not divisible by the group, no MoE layer). */
int sl_model_set_moe_dispatch(struct sl_model *m, const struct sl_moe_dispatch *d);
/* pause (true) and resume the capacity (evaluation): while paused no token is dropped, and with
 * one rank per expert group every expert runs locally; experts split over ranks are still
 * reached through the dispatch, so every rank of the group must run the same forwards */
void sl_model_moe_dispatch_pause(struct sl_model *m, bool pause);
/* choices dropped by the capacity (all MoE layers) in the last micro-batch */
long long sl_model_moe_dropped(const struct sl_model *m);

/*
 * Memory that nothing of the model reads or writes from the end of unit @unit's backward in a
 * training step (@during: from the first use of its gradient buffer, src->grads) until the next
 * forward: a layer's activations, *bytes long; NULL (and 0) for units without (the head, the
 * experts, the last layer while it runs, a tied embedding, Qwen3.5 layers, activation
 * checkpointing).
 */
void *sl_model_grad_room(struct sl_model *m, int unit, bool during, size_t *bytes);

/* Bytes of backend memory the model's workspace holds. */
size_t sl_model_workspace_bytes(const struct sl_model *m);

#endif
