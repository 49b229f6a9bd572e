/* tb.h: placeholder */
