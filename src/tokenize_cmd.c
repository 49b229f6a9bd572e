/* tokenize_cmd.c: placeholder until its author lands it */
