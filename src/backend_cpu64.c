/* The cpu backend built with double compute elements, for gradient checks. */
#define SL_CPU_DOUBLE 1
#include "backend_cpu.c"
