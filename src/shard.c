/* shard.c: placeholder */
