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

/* Text jansson accepted has well-formed strings, so quotes and
 * backslashes are enough to tell inside from outside. */
static int nul_outside_strings(const char *s, size_t len)
{
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (in_str) {
            if (s[i] == '\\')
                i++;
            else if (s[i] == '"')
                in_str = 0;
        } else if (s[i] == '"') {
            in_str = 1;
        } else if (s[i] == '\0') {
            return 1;
        }
    }
    return 0;
}

json_t *tst_jref_load(const char *s, size_t len, size_t flags)
{
    json_error_t je;
    json_t *j = s ? json_loadb(s, len, flags, &je) : NULL;
    if (j && nul_outside_strings(s, len)) {
        json_decref(j);
        j = NULL;
    }
    return j;
}
