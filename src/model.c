/* model.c: placeholder */
