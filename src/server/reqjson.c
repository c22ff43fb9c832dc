/* reqjson.c - strict reading of JSON request bodies (reqjson.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "quotagate.h"
#include "reqjson.h"

/* Deepest nesting of [ and { outside strings. */
static int depth_of(const char *s, size_t len)
{
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                max = depth;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return max;
}

json_t *qg__reqjson_parse(const char *body, size_t len,
                         const char *const *allowed, char *err, size_t cap)
{
    json_error_t je;
    json_t *o;
    const char *key;
    json_t *v;

    if (len == 0) {
        snprintf(err, cap, "the request body must be a JSON object");
        return NULL;
    }
    if (depth_of(body, len) > QG_JSON_MAX_DEPTH) {
        snprintf(err, cap, "JSON nested deeper than %d levels",
                 QG_JSON_MAX_DEPTH);
        return NULL;
    }
    o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        snprintf(err, cap, "malformed JSON at line %d column %d: %s",
                 je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        snprintf(err, cap, "the request body must be a JSON object");
        json_decref(o);
        return NULL;
    }
    json_object_foreach(o, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok) {
            snprintf(err, cap, "unknown field \"%.64s\"", key);
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

int qg__reqjson_str(json_t *o, const char *key, int required, size_t maxlen,
                   const char **out, char *err, size_t cap)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, cap, "%s is required", key);
            return -1;
        }
        return 0;
    }
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        json_string_length(v) > maxlen ||
        strlen(json_string_value(v)) != json_string_length(v)) {
        snprintf(err, cap, "%s must be a string of 1 to %zu bytes", key,
                 maxlen);
        return -1;
    }
    *out = json_string_value(v);
    return 1;
}

int qg__reqjson_int(json_t *o, const char *key, int required, int64_t min,
                   int64_t max, int64_t *out, char *err, size_t cap)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, cap, "%s is required", key);
            return -1;
        }
        return 0;
    }
    if (json_is_integer(v) && json_integer_value(v) > max) {
        snprintf(err, cap, "%s must be at most %lld", key, (long long)max);
        return -2;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min) {
        snprintf(err, cap, "%s must be an integer from %lld to %lld", key,
                 (long long)min, (long long)max);
        return -1;
    }
    *out = json_integer_value(v);
    return 1;
}

int qg__reqjson_milli(json_t *o, const char *key, int required, int64_t *out,
                     char *err, size_t cap)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, cap, "%s is required", key);
            return -1;
        }
        return 0;
    }
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0) {
            snprintf(err, cap, "%s must be a number >= 0", key);
            return -1;
        }
        if (i > QG_AMOUNT_MAX_MILLI / 1000) {
            snprintf(err, cap, "%s must be at most %lld (the bound on one "
                     "request's weight)", key,
                     (long long)(QG_AMOUNT_MAX_MILLI / 1000));
            return -2;
        }
        *out = (int64_t)i * 1000;
        return 1;
    }
    if (json_is_real(v)) {
        /* The input boundary: a decimal from JSON into milli-units; it
         * must be exact to the milli (at most 3 decimals).  r is the
         * nearest milli count (below 2^53: exact); r / 1000 is the
         * double nearest that 3-decimal value, and the text's own double
         * equals it only when the text is that value: two decimals of at
         * most 15 significant digits never share a double.  (A test
         * relative to the value let 999.9999 through as 1000.) */
        double d = json_real_value(v), r = nearbyint(d * 1000.0);
        if (d > 1e12) {
            snprintf(err, cap, "%s with a fraction or exponent must be at "
                     "most 1000000000000 (whole numbers up to %lld)", key,
                     (long long)(QG_AMOUNT_MAX_MILLI / 1000));
            return -2;
        }
        if (!(d >= 0) || r / 1000.0 != d) {
            snprintf(err, cap, "%s must be a number >= 0 with at most 3 "
                     "decimals", key);
            return -1;
        }
        *out = (int64_t)r;
        return 1;
    }
    snprintf(err, cap, "%s must be a number", key);
    return -1;
}
