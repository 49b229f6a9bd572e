/* optim.c: placeholder */
