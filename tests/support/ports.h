/* ports.h - loopback ports for the servers the tests start themselves
 * (quotagate, nginx, Redis, PostgreSQL): one that is free now, and
 * whether something listens on one. */
#ifndef QG_TEST_PORTS_H
#define QG_TEST_PORTS_H

/* A port nothing listens on now (the kernel's pick for 127.0.0.1:0), or
 * -1.  Another process may take it before the caller binds: start the
 * server and check it came up. */
int tst_free_port(void);
/* 1 when a TCP connect to 127.0.0.1:port succeeds. */
int tst_port_open(int port);
/* Wait up to ms for tst_port_open(port).  Returns 0, or -1 on timeout. */
int tst_wait_port(int port, int ms);

#endif
