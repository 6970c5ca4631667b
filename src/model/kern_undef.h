/* Ends one instruction set's inclusion of kern_body.h (kern.c). No include
 * guard: it is included once after each. */
#undef KB
#undef KB_ATTR
#undef KB_NAME
#undef KV
#undef KVL
#undef KVS
#undef KB_W
#undef KB_LDF
#undef KB_STF
#undef KB_SQRTS
#undef KB_FJ
#undef KB_FE
#undef KB_BE
#undef KB_BI
#undef KB_WJ
#undef KB_WI
#undef KB_HSUM8
