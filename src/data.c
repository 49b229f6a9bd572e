/* data.c: placeholder */
