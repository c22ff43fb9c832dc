/* jref.c - see jref.h. */
#include "jref.h"

int tst_jref_count(const json_t *obj, const char *key, int64_t *v)
{
    json_t *x = json_object_get(obj, key);
    if (!x || json_is_null(x))
        return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return -1;
    *v = (int64_t)json_integer_value(x);
    return 1;
}

int tst_jref_count2(const json_t *obj, const char *k1, const char *k2,
                    int64_t *v)
{
    int rc = tst_jref_count(obj, k1, v);
    return rc ? rc : tst_jref_count(obj, k2, v);
}
