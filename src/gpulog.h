/* gpulog.h: placeholder */
