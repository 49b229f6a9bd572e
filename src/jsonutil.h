/*
 * jsonutil: what the modules that read JSON records share (data's loaders, chat's message
 * checks): a value's kind in the words of an error message.
 */
#ifndef SL_JSONUTIL_H
#define SL_JSONUTIL_H

#include <jansson.h>

/* "an object", "a string", ...: what a record held where something else was wanted */
static inline const char *json_type_name(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
		return "an integer";
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	case JSON_NULL:
		return "null";
	}
	return "a JSON value";
}

#endif
