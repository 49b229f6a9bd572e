/* tokenizer.h: placeholder */
