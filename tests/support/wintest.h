/* wintest.h - helpers shared by the window unit tests (test_win_*.c):
 * builders of a qg_window_spec for each window type, and thin wrappers
 * that admit, charge, view, adjust and release at a given instant. */
#ifndef QG_TEST_WINTEST_H
#define QG_TEST_WINTEST_H

#include <stdint.h>
#include "window.h"

/* Spec builders (zeroed spec with the fields each test file sets). */
qg_window_spec tst_roll_spec(int64_t limit, int64_t len, int64_t prec,
                             uint32_t maxe);
qg_window_spec tst_sess_spec(int64_t limit, int64_t len);
qg_window_spec tst_rate_spec(int64_t limit, int64_t per, int64_t burst,
                             qg_unit unit);
/* Calendar spec at minute of day, mday 1, in time zone tz. */
qg_window_spec tst_cal_spec(int64_t limit, qg_every every, int minute,
                            const qg_tz *tz);
qg_window_spec tst_conc_spec(int64_t slots, int64_t ttl);

/* qg__win_admit_at at now for amount a. */
int64_t tst_win_admit(const qg_window_spec *s, qg_win_state *st, int64_t now,
                      int64_t a);
/* qg__win_charge at now for amount a; asserts it returns 0. */
void tst_win_charge(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    int64_t a);
/* qg__win_view at now. */
qg_window_view tst_win_view(const qg_window_spec *s, qg_win_state *st,
                            int64_t now);
/* qg__win_adjust at now of the charge made at t0 by d. */
void tst_win_adjust(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    int64_t t0, int64_t d);

/* Concurrency windows: admit / charge / release one request (amount of
 * qg__win_amount(s, 5555)) for request id rid. */
int64_t tst_conc_admit(const qg_window_spec *s, qg_win_state *st, int64_t now);
int tst_conc_charge(const qg_window_spec *s, qg_win_state *st, int64_t now,
                    uint64_t rid);
int tst_conc_release(const qg_window_spec *s, qg_win_state *st, int64_t now,
                     uint64_t rid);

#endif
