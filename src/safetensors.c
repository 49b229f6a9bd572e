/* safetensors.c: placeholder */
