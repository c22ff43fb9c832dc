/* fuzz_respscan.c - the response JSON scanner (respscan.c, one yajl pass)
 * through every reader built on it, differentially: usage.h's body,
 * chunk and event readers and proxy.h's content byte counts must give
 * exactly the answers of the jansson readers they replaced (return
 * value, counts, error type, usage-only flag, content bytes), as
 * tests/support/respref.c keeps them; a disagreement aborts.  The whole
 * body readers of proxy.h (qg__content_bytes_json, jansson) run too, for
 * the sanitizers. */
#include <string.h>

#include "fuzz.h"
#include "jref.h"
#include "proxy.h"
#include "usage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    if (!tst_resp_agree(s, size))
        fuzz_fail("respscan differs from the jansson reference", data, size);
    if (qg__content_bytes_json(s, size, QG_SHAPE_OPENAI) < 0 ||
        qg__content_bytes_json(s, size, QG_SHAPE_ANTHROPIC) < 0)
        fuzz_fail("negative content bytes", data, size);
    return 0;
}
