/* gpulog.c: placeholder until its author lands it */
