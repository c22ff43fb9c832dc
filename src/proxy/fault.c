/* fault.c - see fault.h: the hook that allocation fault injection
 * installs (tests only).  Static storage starts as NULL, so nothing
 * fails anywhere else. */
#include "fault.h"

_Atomic(qg__alloc_hook) qg__alloc_fail_hook;
