/* config.c: placeholder */
