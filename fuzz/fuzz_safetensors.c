/*
 * fuzz_safetensors: the safetensors header parser (sl_weights_open_file): header length, JSON
 * header, dtypes, shapes and data offsets against the file size, then a conversion of every
 * tensor the parser accepted (so an accepted offset that lies outside the file is caught).
 */
#include "fuzz_common.h"

#include <stdlib.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl_weights w;
	char path[64];
	int rc = fuzz_memfile(data, size, path, sizeof(path));

	if (rc < 0)
		return 0;
	if (sl_weights_open_file(&w, path) == 0) {
		for (int i = 0; i < w.n_tensors; i++) {
			const struct sl_st_tensor *t = &w.tensors[i];
			float *x;

			if (t->dtype == SL_DT_OTHER || t->numel > (1 << 20))
				continue;
			x = malloc((t->numel ? t->numel : 1) * sizeof(float));
			if (x)
				sl_st_to_f32(t, x);
			free(x);
		}
		sl_weights_close(&w);
	}
	unlink(path);
	return 0;
}
