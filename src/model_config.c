/* model_config.c: placeholder */
