/*
 * data_chat: the SFT side of records (task: sft), for data.c and data_tokenize.c.
 *
 * Owns what a record means for SFT: a chat record rendered through the model's chat template
 * (chat.c) into ids and a loss mask, a pre-tokenized record's "loss_mask", and the default mask
 * of text (every token a target but the first, which nothing predicts).  Errors come back as
 * messages, since data_tokenize.c tokenizes records on OpenMP threads and names FILE:LINE.
 */
#define _GNU_SOURCE
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat.h"
#include "log.h"
#include "tokenizer.h"

int sl_data_chat_record(const struct sl_data_opts *o, json_t *record, int32_t **ids,
			uint8_t **mask, size_t *cap, int *n, char **err)
{
	json_t *messages, *tools;
	char *why = NULL;
	int rc;

	*err = NULL;
	rc = sl_chat_record(record, &messages, &tools, &why);
	if (rc == 1)
		return 1;
	if (rc < 0) {
		*err = why;
		return rc;
	}
	if (!o->sft) {
		*err = sl_msgf("a chat record (\"messages\" or \"conversations\") needs task: sft");
		rc = -EINVAL;
	} else if (!o->tokenizer) {
		*err = sl_msgf("a chat record needs the model's tokenizer.json (and its chat template) "
			       "beside the model");
		rc = -EINVAL;
	} else {
		rc = sl_chat_encode(o->chat, o->tokenizer, messages, tools, o->keep_reasoning, ids,
				    mask, cap, &why);
		if (rc >= 0) {
			*n = rc;
			rc = 0;
		} else {
			*err = why;
		}
	}
	json_decref(messages);
	json_decref(tools);
	return rc;
}

int sl_data_loss_mask(json_t *record, int n, uint8_t *mask, char **err)
{
	json_t *m = json_object_get(record, "loss_mask"), *e;
	size_t i;

	*err = NULL;
	if (!m || json_is_null(m)) {
		memset(mask, 1, n);
		mask[0] = 0;
		return 0;
	}
	if (!json_is_array(m) || json_array_size(m) != (size_t)n) {
		*err = json_is_array(m) ?
			sl_msgf("\"loss_mask\" has %zu entries but \"input_ids\" %d; give one 0/1 "
				"per token", json_array_size(m), n) :
			sl_msgf("\"loss_mask\" must be an array of 0/1, one per token of "
				"\"input_ids\"");
		return -EINVAL;
	}
	json_array_foreach(m, i, e) {
		json_int_t v = json_is_integer(e) ? json_integer_value(e) : -1;

		if (v != 0 && v != 1) {
			*err = sl_msgf("\"loss_mask\"[%zu] is not 0 or 1", i);
			return -EINVAL;
		}
		mask[i] = (uint8_t)v;
	}
	if (mask[0]) {
		*err = sl_msgf("\"loss_mask\"[0] is 1, but no logits come before token 0 to "
			       "predict it: loss_mask[t] = 1 makes token t a target, predicted "
			       "from position t-1 (is the mask shifted?)");
		return -EINVAL;
	}
	return 0;
}

bool sl_data_has_target(const uint8_t *mask, int n)
{
	return n > 0 && memchr(mask, 1, n) != NULL;
}

uint64_t sl_data_sft_key(const struct sl_data_opts *o)
{
	uint64_t h = sl_hash64(o->sft ? "sft" : "classify", o->sft ? 3 : 8, 0);

	if (!o->sft)
		return h;
	h = sl_hash64(o->keep_reasoning ? "keep" : "drop", 4, h);
	return sl_hash64(&(uint64_t){ sl_chat_hash(o->chat) }, sizeof(uint64_t), h);
}
