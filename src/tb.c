/* tb.c: placeholder until its author lands it */
