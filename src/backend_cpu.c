/* backend_cpu.c: placeholder */
