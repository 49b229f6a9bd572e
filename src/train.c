/*
 * train: `shardlm train` (see train.h): the job, set up in the order data flows (config, backend,
 * run directory, model files, tokenizer and data, process groups and shards, the weights or the
 * checkpoint to resume, the model, the metrics), run (the step loop, train_step.c) and torn
 * down.  The parts it uses are its siblings, listed in train_impl.h.
 * Errors in user input stop before anything in the run directory is overwritten.
 */
#define _GNU_SOURCE
#include "sl_build.h"
#include "train_impl.h"

#include <errno.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"
#include "fsutil.h"
#include "log.h"
#include "plan.h"
#include "signals.h"

/*
 * Text records are tokenized once into the cache, the lines split over the ranks (and threads);
 * then every rank loads the whole cache (the sampler orders all records by length).
 */
/* sl_shard_opts.grad_room: a layer's activations (see sl_model_grad_room) */
static void *grad_room(void *ctx, int unit, bool during, size_t *bytes)
{
	return sl_model_grad_room(ctx, unit, during, bytes);
}

static int load_data(struct sl_dataset *ds, const char *path, const struct sl_config *c,
		     int vocab, struct sl_tokenizer *tok, const struct sl_chat *chat,
		     const struct sl_dist *d, const char *what)
{
	struct sl_data_opts o = {
		.text_field = c->data.text_field, .label_field = c->data.label_field,
		.max_state = c->data.max_state, .need_label = c->task == SL_TASK_CLASSIFY,
		.skip_errors = c->data.on_error == SL_ON_ERROR_SKIP, .vocab = vocab,
		.tokenizer = tok, .progress = d->rank == 0,
		.sft = c->task == SL_TASK_SFT, .keep_reasoning = c->data.keep_reasoning,
		.chat = chat,
	};

	if (tok && d->world > 1) {
		if (!all_ok(sl_data_tokenize_part(path, &o, d->rank, d->world) == 0))
			return -1;
	}
	if (sl_data_load(ds, path, &o))
		return -1;
	if (ds->skipped)
		sl_log("%s: skipped %ld bad line(s) (data.on_error: skip)", path, ds->skipped);
	sl_log("%s: dropped %ld of %ld records that exceed the training context (max_state %d)",
	       path, ds->dropped, ds->total, c->data.max_state);
	if (o.sft)
		sl_log("%s: dropped %ld of %ld records without a target token (no assistant turn, "
		       "or an all-zero loss_mask)", path, ds->no_target, ds->total);
	if (ds->n == 0) {
		sl_error("%s: no %s records left to use", path, what);
		return -1;
	}
	return 0;
}

void train_format_duration(double s, char *buf, size_t n)
{
	long t = (long)(s + 0.5);

	if (t >= 3600)
		snprintf(buf, n, "%ldh %02ldm %02lds", t / 3600, t / 60 % 60, t % 60);
	else if (t >= 60)
		snprintf(buf, n, "%ldm %02lds", t / 60, t % 60);
	else
		snprintf(buf, n, "%.1fs", s);
}

static void log_config(const struct sl_config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	sl_config_print_table(c, f);
	fclose(f);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
		sl_log("  %s", line);
	free(buf);
}

static char *config_yaml(const struct sl_config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	sl_config_write_yaml(c, f);
	fclose(f);
	return buf;
}

/* Where offload's host time went: what the schedule hid of the host AdamW and what it did not. */
static void log_offload(struct job *j)
{
	struct sl_offload_stats st;

	double t0 = sl_now();

	if (!j->have_shard || !j->sh.host_state)
		return;
	/* the last update has no next forward to hide behind: what is left of it counts */
	sl_shard_drain(&j->sh);
	sl_offload_stats(&j->sh, &st);
	st.wait_s += sl_now() - t0;
	if (!st.updates)
		return;
	sl_log("offload: host AdamW %.3f s per update (%d updates, %d threads), the next forward "
	       "waited %.3f s of it per update (%.0f%% hidden); gradient sums on the host %.3f s "
	       "per step", st.adam_s / st.updates, st.updates, omp_get_max_threads() > 2 ?
	       omp_get_max_threads() - 1 : omp_get_max_threads(),
	       st.wait_s / st.updates, st.adam_s > 0 ? 100 * (1 - st.wait_s / st.adam_s) : 0,
	       st.grad_s / st.updates);
}

/*
 * tests: SHARDLM_TEST_HOST_ACCUM: offload adds micro-batches up on the host even where the GPU
 * has room; SHARDLM_TEST_HOST_LEAN: offload optimizer keeps gradients on the device (host_lean)
 * even where the host has room; SHARDLM_TEST_USR1_AT_START: SIGUSR1 before MPI starts.
 */
static bool test_env(const char *name)
{
	const char *e = getenv(name);

	return e && *e && strcmp(e, "0");
}

/*
 * AdamW under the next step's forward (sl_shard_opts.overlap_optimizer): on by default on the
 * cuda backend, where it saves 1-2% of a step (bench/RESULTS.md, twenty-fifth session), off on
 * the cpu backend, where the side stream only defers the work; SHARDLM_OPT_OVERLAP=0 or =1
 * decides instead (the same bits either way).
 */
static bool opt_overlap(const struct job *j)
{
	const char *e = getenv("SHARDLM_OPT_OVERLAP");

	if (e && *e)
		return strcmp(e, "0") != 0;
	return j->c->backend == SL_BACKEND_CUDA;
}

/*
 * SHARDLM_OPT_AHEAD and SHARDLM_OPT_CHUNK (sl_shard_opts.optimizer_ahead, optimizer_chunk): a
 * count, @dflt when unset; anything else than digits stops the run.
 */
static long env_count(const char *name, long dflt)
{
	const char *e = getenv(name);
	char *end;
	long v;

	if (!e || !*e)
		return dflt;
	errno = 0;
	v = strtol(e, &end, 10);
	if (errno || *end || v < 0) {
		sl_error("%s=%s: want a count (0 or more)", name, e);
		exit(2);
	}
	return v;
}

static void job_free(struct job *j)
{
	sl_gpulog_stop(j->gpulog);
	sl_tb_close(j->tb);
	if (j->be) {
		dev_batch_free(j->be, &j->db);
		sl_cp_destroy(&j->cp);
		if (j->model)
			sl_model_destroy(j->model);
		if (j->have_md)
			sl_moe_dist_destroy(&j->md);
		if (j->have_shard)
			sl_shard_destroy(&j->sh);
		j->be->destroy(j->be);
	}
	sl_host_batch_free(&j->hb);
	sl_metrics_destroy(j->met);
	sl_sampler_free(&j->smp);
	sl_data_free(&j->train);
	sl_data_free(&j->valid);
	if (j->have_mf)
		sl_model_files_close(&j->mf);
	if (j->have_xcomm)
		sl_comm_destroy(&j->xcomm);
	if (j->have_groups)
		sl_groups_destroy(&j->g);
	if (j->tok)
		sl_tokenizer_free(j->tok);
	sl_chat_free(j->chat);
	free(j->yaml);
	free(j->c);
}

static void metrics_run_info(struct job *j)
{
	time_t now = time(NULL);
	char when[64];

	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime(&now));
	sl_metrics_run_int(j->met, "world", j->d.world);
	sl_metrics_run_int(j->met, "batch", j->c->train.batch);
	sl_metrics_run_int(j->met, "accum", j->c->train.accum);
	sl_metrics_run_int(j->met, "records_per_step", j->R);
	sl_metrics_run_int(j->met, "epoch_records", j->train.n);
	sl_metrics_run_int(j->met, "dropped_records", j->train.dropped);
	sl_metrics_run_int(j->met, "total_records", j->train.total);
	sl_metrics_run_int(j->met, "params", (long long)j->mf.lay.total_numel);
	sl_metrics_run_int(j->met, "max_state", j->c->data.max_state);
	sl_metrics_run_int(j->met, "steps", j->steps);
	sl_metrics_run_int(j->met, "skipped_steps", 0);
	sl_metrics_run_string(j->met, "backend", j->cuda ? "cuda" : "cpu");
	sl_metrics_run_double(j->met, "start_unix", sl_unix_time());
	sl_metrics_run_string(j->met, "start_local", when);
	if (j->first_step > 1)
		sl_metrics_run_int(j->met, "resumed_after_step", j->first_step - 1);
}

int sl_cmd_train(int argc, char **argv)
{
	struct job jj = { 0 }, *j = &jj;
	char path[SL_PATH_MAX + 64], ckpt_dir[SL_PATH_MAX + 64], dur[64];
	int ret = 2, verdict = 0, n_init = 0;
	bool resume = false, accum_dev = false, lean = false;
	int gdn_aux = 0;

	ckpt_dir[0] = 0;
	sl_log_init();
	/*
	 * The handlers first: a preemption notice (SIGUSR1) that comes while MPI starts or the
	 * config loads must not kill the rank; until the config is read the grace is its default.
	 */
	sl_signals_install(25);
	/* tests: a preemption notice while MPI starts */
	if (test_env("SHARDLM_TEST_USR1_AT_START"))
		raise(SIGUSR1);
	j->c = calloc(1, sizeof(*j->c));
	if (sl_dist_init(&j->d, &argc, &argv))
		sl_dist_abort("MPI start-up failed");
	sl_log_set_rank(j->d.rank, j->d.world, j->d.host);
	ret = sl_cmd_parse("train", argc, argv, &j->a);
	if (ret) {
		ret = ret > 0 ? 0 : 2;
		goto out;
	}
	ret = 2;
	/* every rank reads the config: the same files give every rank the same verdict */
	if (sl_config_load(j->c, j->a.config, j->a.set, j->a.nset, true) ||
	    sl_cp_check_config(j->c, j->d.world) || sl_check_supported(j->c, true))
		goto out;
	j->C = j->c->parallel.context;
	if (sl_dist_set_node_size(&j->d, j->c->parallel.node_size))
		goto out;
	sl_signals_set_grace(j->c->checkpoint.term_grace_s);
	if (sl_watchdog_start())
		goto out;
	/* the backend first: a GPU that cannot be used stops the job before the run directory */
	if (!all_ok(train_create_backend(j) == 0))
		goto out;
	/* the memory plan before anything is loaded (GPU size 0: the cpu backend, host only) */
	if (!all_ok(sl_plan_check_job(j->c, j->d.world, j->d.local_size, train_gpu_memory(j),
				      &accum_dev, &lean, &gdn_aux) == 0))
		goto out;
	/* the plan counted the delta rule's saved tiles, or dropped them to fit: the model's
	 * states go without that room, and the backend without the tiles (tests: as if
	 * dropped, SHARDLM_TEST_NO_GDN_AUX) */
	if (gdn_aux > 0 && test_env("SHARDLM_TEST_NO_GDN_AUX"))
		gdn_aux = -1;
	if (gdn_aux < 0)
		j->be->gdn_states_extra = NULL;
	sl_checkpoint_root(j->c, j->ckpt_root, sizeof(j->ckpt_root));
	if (j->d.rank == 0)
		verdict = train_prepare_run_dir(j->c, j->a.fresh, ckpt_dir, sizeof(ckpt_dir));
	MPI_Bcast(&verdict, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Bcast(ckpt_dir, sizeof(ckpt_dir), MPI_CHAR, 0, MPI_COMM_WORLD);
	if (verdict < 0)
		goto out;
	resume = verdict == 1;
	verdict = 0;
	snprintf(path, sizeof(path), "%s/train.log", j->c->run.dir);
	if (!all_ok(sl_log_open_file(path) == 0))
		goto out;
	sl_log("shardlm %s (%s): train %s, run directory %s, %d rank(s) on %d node(s)%s",
	       PACKAGE_VERSION, SL_GIT_COMMIT, j->a.config, j->c->run.dir, j->d.world,
	       j->d.n_nodes, j->d.node_size_overridden ? " (parallel.node_size)" : "");
	log_config(j->c);
	if (gdn_aux < 0)
		sl_log("plan: the Gated DeltaNet layers go without the forward's saved delta and Q "
		       "S0 tiles, which would not fit: the backward makes them again (slower)");
	j->yaml = config_yaml(j->c);
	snprintf(path, sizeof(path), "%s/config.yaml", j->c->run.dir);
	if (!all_ok(j->d.rank != 0 || sl_write_file_atomic(path, j->yaml, strlen(j->yaml)) == 0))
		goto out;

	if (!all_ok(sl_model_files_open(&j->mf, j->c->model.path, j->c->model.revision,
						 j->c->task) == 0))
		goto out;
	j->have_mf = true;
	/*
	 * A packed row holds several documents: attention masks across them (pos), but the Gated
	 * DeltaNet layers' causal convolution and recurrent state know no document starts and
	 * would carry one document into the next.
	 */
	if (j->mf.mc.norm_offset && j->c->data.pack) {
		if (j->d.rank == 0)
			sl_error("%s: data.pack is not supported for the Qwen3.5 hybrid family "
				 "(model %s, %s): its Gated DeltaNet layers' convolution and "
				 "recurrent state would run across the documents of a packed row; "
				 "set data.pack: false", j->c->source, j->mf.dir,
				 j->mf.mc.model_type);
		goto out;
	}
	if (j->C > 1 && j->be->cp_attention_takes &&
	    !j->be->cp_attention_takes(j->mf.mc.head_dim)) {
		if (j->d.rank == 0)
			sl_error("%s: parallel.context %d: the %s backend's context-parallel "
				 "attention does not take head_dim %d (model %s); set "
				 "parallel.context: 1", j->c->source, j->C,
				 j->be->name, j->mf.mc.head_dim, j->mf.dir);
		goto out;
	}
	sl_log("model %s: %s, %d layers, hidden %d, heads %d/%d (head_dim %d), vocab %d, "
	       "%.2fM parameters", j->mf.dir, j->mf.mc.model_type, j->mf.mc.n_layers,
	       j->mf.mc.hidden, j->mf.mc.n_heads, j->mf.mc.n_kv_heads, j->mf.mc.head_dim,
	       j->mf.mc.vocab, j->mf.lay.total_numel / 1e6);
	/* room for the checkpoints (fp32 weights, + 2 moments) before anything heavy is read */
	if (!all_ok(j->d.rank != 0 ||
		    sl_ckpt_check_space(j->ckpt_root, 4.04 * j->mf.lay.total_numel *
					(j->c->checkpoint.optimizer ? 3 : 1),
					j->c->checkpoint.every ? j->c->checkpoint.keep : 0) == 0))
		goto out;

	/* the model's tokenizer, when it has one (pre-tokenized records do not need it) */
	if (snprintf(j->tok_path, sizeof(j->tok_path), "%s/tokenizer.json", j->mf.dir) <
	    (int)sizeof(j->tok_path) && sl_is_file(j->tok_path)) {
		j->tok = sl_tokenizer_load(j->tok_path);
		if (!all_ok(j->tok != NULL))
			goto out;
		/* an unknown template loads too: only chat records refuse it (chat.h) */
		if (!all_ok(j->c->task != SL_TASK_SFT || sl_chat_load(j->mf.dir, &j->chat) == 0))
			goto out;
		if (j->chat && j->d.rank == 0)
			sl_log("chat template: %s (%s)", sl_chat_name(j->chat), j->mf.dir);
	}
	if (!all_ok(load_data(&j->train, j->c->data.train, j->c, j->mf.mc.vocab, j->tok, j->chat,
			      &j->d, "training") == 0))
		goto out;
	if (!all_ok(!j->c->data.valid[0] ||
		    load_data(&j->valid, j->c->data.valid, j->c, j->mf.mc.vocab, j->tok, j->chat,
			      &j->d, "validation") == 0))
		goto out;
	if (!all_ok(sl_sampler_init(&j->smp, &j->train, j->c->train.batch, j->c->train.accum,
				    j->d.world / j->C, j->c->data.shuffle, j->c->data.length_sort,
				    (uint64_t)j->c->data.seed) == 0))
		goto out;
	j->R = sl_sampler_records_per_step(&j->smp);
	j->steps = j->c->train.steps ? j->c->train.steps :
		(int)(j->c->train.epochs * sl_sampler_steps_per_epoch(&j->smp));
	sl_log("%d records, %d per step (batch %d x accum %d x %d data-parallel rank(s)): "
	       "%d steps, %.2f epoch(s)", j->train.n, j->R, j->c->train.batch, j->c->train.accum,
	       j->d.world / j->C, j->steps, (double)j->steps * j->R / j->train.n);

	if (j->d.rank == 0) {
		struct sl_provenance_input pin = {
			.config_path = j->a.config, .model_dir = j->mf.dir,
			.train_path = j->c->data.train, .valid_path = j->c->data.valid,
			.tokenizer_path = j->tok ? j->tok_path : NULL, .argc = argc, .argv = argv, .world = j->d.world,
			.backend = j->c->backend == SL_BACKEND_CUDA ? "cuda" : "cpu",
		};

		snprintf(path, sizeof(path), "%s/provenance.json", j->c->run.dir);
		verdict = sl_provenance_write(path, &pin);
	}
	if (!all_ok(verdict == 0))
		goto out;

	if (!all_ok(sl_groups_create(&j->g, &j->d, j->c->parallel.shard_group == SL_SHARD_NODE,
				     j->comm_kind, &j->copy) == 0))
		goto out;
	j->have_groups = true;
	sl_log("mesh: %d rank(s) = %d data-parallel x %d context (rank = data-parallel index x %d "
	       "+ context index)", j->d.world, j->d.world / j->C, j->C, j->C);
	if (j->cuda) {
		/* collectives run in order with the compute on the backend's stream */
		j->g.world.stream = j->g.shard.stream = j->g.replica.stream = train_gpu_stream(j);
	}
	{
		int rc = sl_moe_dist_expert_comm(j->c, &j->mf.mc, j->d.rank, j->d.world,
						 j->c->parallel.shard_group == SL_SHARD_NODE ?
						 j->d.node : 0, j->g.shard.size, j->comm_kind,
						 &j->copy, &j->xcomm, &j->xq);

		j->have_xcomm = rc == 0;
		if (!all_ok(rc >= 0))
			goto out;
		if (j->have_xcomm && j->cuda)
			j->xcomm.stream = train_gpu_stream(j);
	}
	/* the model first: its activations can hold the layers' gradients (grad_room) */
	j->max_L = sl_data_max_len(&j->train);
	if (j->valid.n && sl_data_max_len(&j->valid) > j->max_L)
		j->max_L = sl_data_max_len(&j->valid);
	/* context parallel: the workspace holds 1/C of the rows (padded to a multiple of 2C) */
	j->model = sl_model_create(&j->mf.mc, &j->mf.lay, j->be,
				   j->c->train.batch * (sl_cp_row_len(j->max_L, j->C) / j->C),
				   j->c->train.batch, j->c->train.activation_checkpointing);
	if (!all_ok(j->model != NULL))
		goto out;
	{
		struct sl_shard_opts so = {
			.shard_comm = &j->g.shard, .replica_comm = &j->g.replica,
			.reshard_after_forward = j->c->parallel.reshard_after_forward,
			.prefetch = j->c->parallel.prefetch, .offload = j->c->parallel.offload,
			.accum_on_device = accum_dev && !test_env("SHARDLM_TEST_HOST_ACCUM"),
			.accum = j->c->train.accum,
			.host_lean = lean || test_env("SHARDLM_TEST_HOST_LEAN"),
			.expert_groups = j->have_xcomm ? j->c->parallel.expert : 1,
			.expert_index = j->xq,
			.expert_comm = j->have_xcomm ? &j->xcomm : NULL,
			.grad_room = test_env("SHARDLM_TEST_NO_GRAD_ROOM") ? NULL : grad_room,
			.grad_room_ctx = j->model,
			.no_grad_direct = test_env("SHARDLM_TEST_NO_GRAD_ROOM"),
			.overlap_optimizer = opt_overlap(j),
			.optimizer_ahead = (int)env_count("SHARDLM_OPT_AHEAD", 0),
			.optimizer_chunk = (size_t)env_count("SHARDLM_OPT_CHUNK", 0),
		};

		if (!all_ok(sl_shard_create(&j->sh, j->be, &j->mf.lay, &so) == 0))
			goto out;
		j->have_shard = true;
	}
	{
		size_t lent = 0;
		int n = 0;

		for (int u = 0; u < j->sh.n_units; u++)
			if (j->sh.u[u].grad_lent) {
				lent += j->sh.u[u].shard * j->sh.grad_elt;
				n++;
			}
		if (j->sh.grad_direct)
			sl_log("gradients: one rank, one micro-batch a step: the backward writes "
			       "them in %zu-byte elements where the update reads them (no fp32 "
			       "copy)", j->be->elt);
		if (n)
			sl_log("gradients: %d unit(s)' %s gradient shards (%.2f GiB) live in "
			       "layers' activations between the backward and the update (one "
			       "micro-batch a step)", n, j->sh.grad_direct ? "compute-type" :
			       "fp32", lent / 1073741824.0);
	}
	sl_log("sharding: %d rank(s) per shard group (%s), %d replica(s)", j->sh.S,
	       j->c->parallel.shard_group == SL_SHARD_NODE ? "node: HSDP" : "world: FSDP",
	       j->g.replica.size);
	if (j->sh.overlap_opt) {
		char how[128] = "";

		if (j->sh.opt_ahead > 0)
			snprintf(how, sizeof(how), ", each unit's issued when the forward reads the "
				 "unit %d before it", j->sh.opt_ahead);
		if (j->sh.opt_chunk)
			snprintf(how + strlen(how), sizeof(how) - strlen(how), ", at most %zu "
				 "elements a launch", j->sh.opt_chunk);
		sl_log("optimizer: AdamW on a side stream, under the next step's forward%s%s "
		       "(SHARDLM_OPT_OVERLAP=0: off)", how, j->sh.sq_overlap ? "; the gradient "
		       "norm's sums of squares there too, each under the rest of the backward" : "");
		if (j->sh.early_on && j->c->optim.clip <= 0)
			sl_log("optimizer: no clipping (optim.clip 0), so each unit's AdamW is issued "
			       "as soon as its gradient is done, under the rest of the backward; a "
			       "gradient that turns non-finite after some units were updated stops "
			       "the run (SHARDLM_OPT_BWD=0: off)");
	}
	if (j->have_xcomm) {
		const struct sl_shard_unit *xu = &j->sh.u[j->mf.lay.n_units - 1];

		sl_log("experts: each rank holds %d of the %d experts of every MoE layer (%.2fM "
		       "parameters per layer, sharded over the %d rank(s) holding the same "
		       "experts)", j->mf.mc.n_experts / j->c->parallel.expert, j->mf.mc.n_experts,
		       xu->numel / 1e6, xu->S);
	}
	if (j->sh.host_state)
		sl_log("offload %s: fp32 master weights and moments in host memory, AdamW on the "
		       "host%s%s", sl_offload_name(j->c->parallel.offload),
		       j->sh.host_params ? ", weights streamed per unit" : "",
		       j->sh.lean ? "; lean host: gradients stay on the GPU and stream through the "
		       "host during the update" : j->c->train.accum < 2 ? "" : j->sh.accum_dev ?
		       "; micro-batches add up on the GPU" : "; micro-batches add up in host memory "
		       "(host accumulation: the GPU has no room for fp32 gradients)");
	j->first_step = 1;
	if (resume) {
		if (!all_ok(train_resume_from(j, ckpt_dir) == 0))
			goto out;
	} else {
		if (!all_ok(sl_model_files_load_shard(&j->mf, &j->sh, (uint64_t)j->c->data.seed,
						      &n_init) == 0))
			goto out;
	}

	{
		int rc = sl_moe_dist_setup(&j->md, j->model, j->c, &j->mf.mc, j->d.rank,
					   j->d.world, j->comm_kind, &j->copy);

		j->have_md = rc == 0;
		if (!all_ok(rc >= 0))
			goto out;
		if (j->have_md && j->md.have_rows_comm && j->cuda)
			j->md.rows_comm.stream = train_gpu_stream(j);
	}
	sl_host_batch_alloc(&j->hb, j->c->train.batch, j->max_L);
	dev_batch_alloc(j->be, &j->db, j->c->train.batch, j->max_L);
	if (j->C > 1 && !all_ok(sl_cp_create(&j->cp, j->be, &j->d, j->C, j->comm_kind, &j->copy,
					      j->c->train.batch, j->max_L) == 0))
		goto out;
	if (j->C > 1 && j->cuda)
		j->cp.comm.stream = train_gpu_stream(j);

	snprintf(path, sizeof(path), "%s/training_metrics.json", j->c->run.dir);
	j->met = sl_metrics_create(path);
	metrics_run_info(j);
	if (j->first_step > 1)
		sl_metrics_keep_earlier(j->met, path, j->first_step - 1);
	if (!all_ok(j->d.rank != 0 || sl_metrics_write(j->met) == 0))
		goto out;
	if (j->c->checkpoint.every == 0)
		sl_log("checkpoint.every is 0: no checkpoints (the final model is still exported)");
	if (j->d.rank == 0) {
		snprintf(path, sizeof(path), "%s/tb", j->c->run.dir);
		j->tb = sl_tb_open(path);
	}
	train_start_gpu_log(j);

	verdict = train_run_steps(j);
	log_offload(j);
	if (verdict) {
		ret = verdict > 0 ? verdict : 2;	/* > 0: a stop's exit status */
		goto out;
	}
	if (!j->c->export_.final)
		sl_log("export.final is false: no final model export");
	else if (train_export_final(j))
		goto out;
	ret = 0;
out:
	sl_signals_restore();
	job_free(j);
	train_format_duration(sl_log_elapsed(), dur, sizeof(dur));
	if (ret == 0)
		sl_log("done: the job ran %s", dur);
	else
		sl_log("%s after %s (exit status %d)", ret == SL_EXIT_STOPPED ? "stopped" : "failed",
		       dur, ret);
	sl_log_close_file();
	sl_dist_finalize(&j->d);
	return ret;
}
