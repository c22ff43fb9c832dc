/* rules_file.c - the public way in to rules: read a rules file and its
 * time zones from disk, then parse and validate them (rules_yaml.c does
 * the parsing on the buffer, without I/O). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "quotagate.h"
#include "rules.h"
#include "tzfile.h"

#define RULES_MAX_BYTES (16u << 20)

int qg_rules_load(const char *path, qg_rules **out, char *err, size_t errcap)
{
    FILE *f = NULL;
    char *buf = NULL;
    size_t len = 0;
    qg_diag diag;
    int rc = QG_EIO;

    *out = NULL;
    if (!(f = fopen(path, "rb"))) {
        snprintf(err, errcap, "%s: cannot open rules file: %s", path,
                 strerror(errno));
        goto done;
    }
    if (!(buf = malloc(RULES_MAX_BYTES + 1))) {
        rc = QG_ENOMEM;
        snprintf(err, errcap, "%s: out of memory", path);
        goto done;
    }
    len = fread(buf, 1, RULES_MAX_BYTES + 1, f);
    if (ferror(f)) {
        snprintf(err, errcap, "%s: read error: %s", path, strerror(errno));
        goto done;
    }
    if (len > RULES_MAX_BYTES) {
        rc = QG_ERULES;
        snprintf(err, errcap, "%s: rules file larger than %u bytes", path,
                 RULES_MAX_BYTES);
        goto done;
    }
    buf[len] = '\0';
    memset(&diag, 0, sizeof diag);
    rc = qg__rules_parse(buf, len, path, qg__tz_load_system, NULL, out, &diag);
    if (rc != QG_OK)
        qg__diag_format(&diag, err, errcap);
done:
    if (f)
        fclose(f);
    free(buf);
    return rc;
}
