/* train.c: placeholder */
