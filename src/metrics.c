/* metrics.c: placeholder */
