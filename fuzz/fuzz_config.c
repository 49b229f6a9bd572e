/*
 * fuzz_config: the YAML config loader (sl_config_load) on arbitrary bytes, with validation and
 * without the keys a training run requires.  Includes name other files; the harness runs in
 * a scratch directory where none exist.
 */
#include "fuzz_common.h"

#include <stdlib.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct sl_config c;
	char path[64];
	int rc = fuzz_memfile(data, size, path, sizeof(path));

	if (rc < 0)
		return 0;
	sl_config_load(&c, path, NULL, 0, false);
	unlink(path);
	return 0;
}
