/* tzfile.c - read TZif files from the zoneinfo database.
 *
 * Kept apart from tz.c so that the parsing stays free of I/O.  Zone names
 * come from rules files, so they are validated before touching the file
 * system: only letters, digits and "/_-+", no leading '/', no "..", which
 * keeps every lookup inside the zoneinfo directory.  Files are capped in
 * size and must be regular files. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "tzfile.h"

#define DEFAULT_TZDIR "/usr/share/zoneinfo"

static int valid_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 255 || name[0] == '/' || strstr(name, ".."))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                 (ch >= '0' && ch <= '9') || ch == '/' || ch == '_' ||
                 ch == '-' || ch == '+';
        if (!ok)
            return 0;
        /* no empty path components ("a//b", trailing '/') */
        if (ch == '/' && (name[i + 1] == '/' || name[i + 1] == '\0'))
            return 0;
    }
    return 1;
}


qg_tz *qg__tz_load_system(const char *name, void *ud, char *err, size_t errcap)
{
    const char *dir = ud ? (const char *)ud : getenv("TZDIR");
    char path[4096], why[256];
    unsigned char *buf = NULL;
    struct stat st;
    ssize_t got;
    size_t len = 0;
    int fd, is_utc;
    qg_tz *tz;

    if (!name) {
        qg__errf(err, errcap, "no time zone name");
        return NULL;
    }
    if (!valid_name(name)) {
        qg__errf(err, errcap,
            "invalid time zone name \"%.200s\": expected an IANA name "
            "such as Europe/Berlin", name);
        return NULL;
    }
    if (!dir || !*dir)
        dir = DEFAULT_TZDIR;
    is_utc = strcmp(name, "UTC") == 0 || strcmp(name, "Etc/UTC") == 0;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >=
        sizeof path) {
        qg__errf(err, errcap, "time zone path too long");
        return NULL;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (is_utc)
            return qg__tz_fixed(name, 0);
        if (e == ENOENT || e == ENOTDIR)
            qg__errf(err, errcap, "unknown time zone \"%s\": no such zone in %s",
                name, dir);
        else
            qg__errf(err, errcap, "time zone \"%s\": cannot open %s: %s", name,
                path, strerror(e));
        return NULL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        if (is_utc)
            return qg__tz_fixed(name, 0);
        qg__errf(err, errcap, "unknown time zone \"%s\": no such zone in %s",
            name, dir);
        return NULL;
    }
    if (st.st_size > QG_TZFILE_MAX) {
        close(fd);
        qg__errf(err, errcap, "time zone \"%s\": %s is larger than %d bytes",
            name, path, QG_TZFILE_MAX);
        return NULL;
    }
    /* Read up to the cap plus one byte, in case the file grew meanwhile. */
    buf = malloc(QG_TZFILE_MAX + 1);
    if (!buf) {
        close(fd);
        qg__errf(err, errcap, "out of memory");
        return NULL;
    }
    while (len <= QG_TZFILE_MAX) {
        got = read(fd, buf + len, QG_TZFILE_MAX + 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            qg__errf(err, errcap, "time zone \"%s\": cannot read %s: %s", name,
                path, strerror(errno));
            close(fd);
            free(buf);
            return NULL;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    if (len > QG_TZFILE_MAX) {
        free(buf);
        qg__errf(err, errcap, "time zone \"%s\": %s is larger than %d bytes",
            name, path, QG_TZFILE_MAX);
        return NULL;
    }
    why[0] = '\0';
    tz = qg__tz_from_tzif(name, buf, len, why, sizeof why);
    free(buf);
    if (!tz) {
        if (is_utc)
            return qg__tz_fixed(name, 0);
        qg__errf(err, errcap, "time zone \"%s\": bad zone file %s: %s", name,
            path, why);
    }
    return tz;
}
