# quotagate - top-level build.  Plain make, as Redis and hiredis use.
#
#   make          build build/quotagate (optimised)
#   make run      install missing packages, build, start on the examples
#   make test     install missing packages, build and run every test twice:
#                 optimised and under ASan+UBSan
#   make bench    engine benchmark (docs/benchmarks.md)
#   make soak     30 minutes of mixed traffic, memory and fds must stay flat
#                 (tests/soak/soak.sh; SOAK_MINUTES to change; not in test)
#   make attack   the slow-upload attack of issue 8 at full size against
#                 both builds, with a healthy client (minutes; not in test)
#   make fuzz     build the libFuzzer harnesses (fuzz/fuzz_*.c) with clang
#                 and run each for FUZZ_TIME seconds, or FUZZ_RUNS
#                 executions (docs/fuzzing.md)
#
# Objects of the optimised build go to build/obj, sanitizer ones to
# build/asan/obj, clang's fuzzing ones to build/fuzz/obj; the library is
# built once per flavour and linked into the CLI and every test.

CC      ?= cc
PKGS    := yaml-0.1 jansson yajl libxxhash libevent libevent_pthreads \
           libevent_openssl sqlite3 libssl libcrypto hiredis libpq
CFLAGS_COMMON := -std=gnu11 -Wall -Wextra -Werror -Wshadow -Wpointer-arith \
                 -Wstrict-prototypes -Wmissing-prototypes -g \
                 $(shell pkg-config --cflags $(PKGS) 2>/dev/null) -D_GNU_SOURCE

# The layers (docs/architecture.md), enforced: a folder of src/ sees only
# the public header and the include folders of the layers it stands on,
# so an include that climbs (the core reaching into a store, the CLI into
# the server) does not compile.  Tests, fuzz harnesses and benchmarks see
# everything.
INC_core     := -Iinclude -Isrc/core
INC_store    := $(INC_core) -Isrc/store
INC_io       := $(INC_core) -Isrc/io
INC_analysis := $(INC_core) -Isrc/analysis
INC_http     := -Iinclude -Isrc/http
INC_ledger   := -Iinclude -Isrc/ledger
INC_proxy    := $(INC_core) -Isrc/http -Isrc/proxy
INC_server   := $(INC_core) -Isrc/store -Isrc/io -Isrc/http -Isrc/ledger \
                -Isrc/proxy -Isrc/analysis -Isrc/server
INC_cli      := -Iinclude -Isrc/analysis -Isrc/cli
INC_all      := $(INC_server) -Isrc/analysis -Isrc/cli -Itests/support
# include flags of a source file: its layer's, or all of them outside src/
incs = $(if $(filter src/%,$(1)),$(INC_$(word 2,$(subst /, ,$(1)))),$(INC_all))
LIBS    := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhttp_parser -lpthread -lm
OPT     := -O2
SAN     := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
           -fno-sanitize-recover=all

# the Redis store's scripts, embedded at build time (scripts/embed.sh):
# the library in this order (each file uses the ones before it)
REDIS_LUA := $(addprefix src/store/redis/,bignum.lua common.lua \
               win_rolling.lua win_calendar.lua win_session.lua win_rate.lua \
               win_concurrency.lua decide.lua ops.lua)
GEN_SRC := build/gen/redis_lua_lib.c build/gen/redis_lua_claim.c \
           build/gen/console_assets.c
LIB_SRC := $(wildcard src/core/*.c src/store/*.c src/io/*.c src/analysis/*.c \
             src/http/*.c src/ledger/*.c src/server/*.c src/proxy/*.c) $(GEN_SRC)
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_SUPPORT := $(wildcard tests/support/*.c)

# flavour-specific lists; $(4) is the compiler when not $(CC)
define flavour
$(1)_DIR   := $(2)
$(1)_CC    := $(or $(4),$(CC))
$(1)_FLAGS := $(CFLAGS_COMMON) $(3)
$(1)_LIBOBJ := $$(patsubst %.c,$(2)/obj/%.o,$$(LIB_SRC))
$(1)_CLIOBJ := $$(patsubst %.c,$(2)/obj/%.o,$$(CLI_SRC))
$(1)_SUPOBJ := $$(patsubst %.c,$(2)/obj/%.o,$$(TEST_SUPPORT))
$(1)_TESTS := $$(patsubst tests/unit/%.c,$(2)/tests/%,$$(TEST_SRC))

$(2)/obj/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$($(1)_CC) $$($(1)_FLAGS) $$(call incs,$$<) -MMD -MP -c $$< -o $$@

# a harness gets libFuzzer's prototypes from fuzz/fuzz.h even if it does
# not include it (-Wmissing-prototypes)
$(2)/obj/fuzz/%.o: fuzz/%.c
	@mkdir -p $$(dir $$@)
	$$($(1)_CC) $$($(1)_FLAGS) $$(INC_all) -MMD -MP -include fuzz/fuzz.h \
	    -c $$< -o $$@

$(2)/libquotagate.a: $$($(1)_LIBOBJ)
	@rm -f $$@
	ar rcs $$@ $$^

$(2)/quotagate: $$($(1)_CLIOBJ) $(2)/libquotagate.a
	$$($(1)_CC) $$($(1)_FLAGS) -o $$@ $$^ $(LIBS)

$(2)/tests/%: $(2)/obj/tests/unit/%.o $$($(1)_SUPOBJ) $(2)/libquotagate.a
	@mkdir -p $$(dir $$@)
	$$($(1)_CC) $$($(1)_FLAGS) -o $$@ $$^ $(LIBS) -lcmocka

# a fuzz harness's corpus replayed as a cmocka test (fuzz/replay.c)
$(1)_FUZZOBJ := $$(patsubst %.c,$(2)/obj/%.o,$$(FUZZ_SUPPORT))
$(2)/tests/test_fuzz_%: $(2)/obj/fuzz/fuzz_%.o $(2)/obj/fuzz/replay.o \
                        $$($(1)_FUZZOBJ) $(2)/libquotagate.a
	@mkdir -p $$(dir $$@)
	$$($(1)_CC) $$($(1)_FLAGS) -o $$@ $$^ $(LIBS) -lcmocka

-include $$($(1)_LIBOBJ:.o=.d) $$($(1)_CLIOBJ:.o=.d) $$($(1)_SUPOBJ:.o=.d) \
         $$(patsubst %.c,$(2)/obj/%.d,$$(TEST_SRC) $$(FUZZ_SRC) fuzz/replay.c)
endef

# Fuzzing (docs/fuzzing.md): every fuzz/fuzz_NAME.c is a libFuzzer harness
# with its corpus in fuzz/corpus/NAME/.  make test replays each corpus
# through fuzz/replay.c in both gcc flavours (test_fuzz_NAME); make fuzz
# builds the harnesses with clang (libFuzzer, ASan, UBSan) and runs them.
FUZZ_SRC     := $(wildcard fuzz/fuzz_*.c)
FUZZ_NAMES   := $(patsubst fuzz/fuzz_%.c,%,$(FUZZ_SRC))
# the reference readers the differential harnesses compare with
FUZZ_SUPPORT := $(wildcard tests/support/jref.c tests/support/respref.c \
                  tests/support/reqjsonref.c \
                  tests/support/reqref.c)
FUZZ_CC      := clang
FUZZ_FLAGS   := -O1 -fsanitize=fuzzer-no-link,address,undefined \
                -fno-omit-frame-pointer -fno-sanitize-recover=all
FUZZ_TIME    ?= 60

build/gen/redis_lua_lib.c: $(REDIS_LUA) scripts/embed.sh
	@mkdir -p $(dir $@)
	scripts/embed.sh $@ qg__redis_lua_lib $(REDIS_LUA)
build/gen/redis_lua_claim.c: src/store/redis/claim.lua scripts/embed.sh
	@mkdir -p $(dir $@)
	scripts/embed.sh $@ qg__redis_lua_claim src/store/redis/claim.lua

# the usage console (docs/console.md): npm packages installed from the
# committed lockfile (npm ci writes node_modules/.package-lock.json), the
# sources bundled by esbuild into build/console, that folder embedded as
# a table of files (scripts/embed_assets.sh) served by h_console.c
CONSOLE_SRC := $(wildcard console/src/*) console/build.mjs
console/node_modules/.package-lock.json: console/package-lock.json
	cd console && npm ci --no-audit --no-fund --loglevel=error
build/console/index.html: $(CONSOLE_SRC) console/node_modules/.package-lock.json
	node console/build.mjs build/console
build/gen/console_assets.c: build/console/index.html scripts/embed_assets.sh
	@mkdir -p $(dir $@)
	scripts/embed_assets.sh $@ build/console

$(eval $(call flavour,OPTB,build,$(OPT)))
$(eval $(call flavour,ASANB,build/asan,$(SAN)))
$(eval $(call flavour,FUZZB,build/fuzz,$(FUZZ_FLAGS),$(FUZZ_CC)))

OPTB_TESTS  += $(patsubst %,build/tests/test_fuzz_%,$(FUZZ_NAMES))
ASANB_TESTS += $(patsubst %,build/asan/tests/test_fuzz_%,$(FUZZ_NAMES))
FUZZ_BINS   := $(patsubst %,build/fuzz/fuzz_%,$(FUZZ_NAMES))

# kept although only pattern rules name them
.SECONDARY: $(foreach d,build build/asan build/fuzz,$(patsubst %.c,$(d)/obj/%.o,\
              $(FUZZ_SRC) fuzz/replay.c $(FUZZ_SUPPORT)))

build/fuzz/fuzz_%: build/fuzz/obj/fuzz/fuzz_%.o $(FUZZB_FUZZOBJ) build/fuzz/libquotagate.a
	$(FUZZ_CC) $(FUZZB_FLAGS) -fsanitize=fuzzer -o $@ $^ $(LIBS)

.PHONY: all deps deps-test deps-bench deps-fuzz run test test-build bench \
        soak attack fuzz fuzz-build clean
.DEFAULT_GOAL := all

all: deps build/quotagate

deps:
	@scripts/deps.sh build
deps-test:
	@scripts/deps.sh test

build/quotagate: $(OPTB_CLIOBJ) build/libquotagate.a

run: all
	@scripts/run.sh

test: deps-test
	@$(MAKE) --no-print-directory test-build
	@tests/run.sh build build/asan

test-build: build/quotagate $(OPTB_TESTS) build/asan/quotagate $(ASANB_TESTS) \
            build/upstream_double build/asan/upstream_double

# the proxy tests' fake model provider (tests/upstream/upstream_double.c)
DOUBLE_LIBS := $(shell pkg-config --libs jansson libevent 2>/dev/null)
build/upstream_double: tests/upstream/upstream_double.c
	@mkdir -p $(dir $@)
	$(CC) $(OPTB_FLAGS) -o $@ $< $(DOUBLE_LIBS)
build/asan/upstream_double: tests/upstream/upstream_double.c
	@mkdir -p $(dir $@)
	$(CC) $(ASANB_FLAGS) -o $@ $< $(DOUBLE_LIBS)

bench: deps-bench build/bench_engine build/bench_ledger build/bench_ledger_pg build/quotagate \
       build/upstream_double build/tests/test_store_redis build/bench_history build/bench_explain
	@build/bench_engine
	@build/bench_ledger
	@build/bench_explain
	@build/bench_ledger_pg
	@build/bench_history
	@bench/http_bench.sh
	@bench/proxy_bench.sh
	@bench/rebuild_bench.sh
	@bench/redis_bench.sh
	@bench/redis_diff.sh
	@bench/pg_bench.sh
	@bench/webhook_bench.sh
	@bench/ledger_age_bench.sh

soak: deps-bench build/quotagate build/upstream_double build/soak_chaos
	@tests/soak/soak.sh

build/soak_chaos: tests/soak/chaos.c
	@mkdir -p $(dir $@)
	$(CC) $(OPTB_FLAGS) -o $@ $< -lpthread

deps-bench:
	@scripts/deps.sh bench

deps-fuzz:
	@scripts/deps.sh fuzz

# make fuzz [FUZZ_TIME=seconds per harness] [FUZZ=name]: new inputs go to
# build/fuzz/work/NAME, never into fuzz/corpus (docs/fuzzing.md)
fuzz: deps-fuzz
	@$(MAKE) --no-print-directory fuzz-build
	@scripts/fuzz.sh $(FUZZ_TIME) $(or $(FUZZ),$(FUZZ_NAMES))

fuzz-build: $(FUZZ_BINS)

build/bench_engine: bench/bench_engine.c build/obj/tests/support/refmodel.o build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O3 -o $@ bench/bench_engine.c build/obj/tests/support/refmodel.o build/libquotagate.a $(LIBS)

# the Redis store's script cost per operation and decision shape
# (docs/redis-store.md, "Cost per decision"); needs redis-server
build/bench_redis: bench/bench_redis.c build/obj/tests/support/redisproc.o build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O2 -o $@ bench/bench_redis.c build/obj/tests/support/redisproc.o build/libquotagate.a $(LIBS)

build/bench_ledger: bench/bench_ledger.c build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O3 -o $@ bench/bench_ledger.c build/libquotagate.a $(LIBS)

# explain on a 10-million-row SQLite ledger (docs/benchmarks.md)
build/bench_explain: bench/bench_explain.c build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O2 -o $@ bench/bench_explain.c build/libquotagate.a $(LIBS)

# the PostgreSQL ledger's two ways of sending a batch, side by side
# (docs/ledger-postgresql.md); starts its own PostgreSQL 15
build/bench_ledger_pg: bench/bench_ledger_pg.c build/obj/tests/support/pgproc.o \
                       build/obj/tests/support/ports.o build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O2 -o $@ $^ $(LIBS)

# 9,000 slow uploads against build/ then build/asan/ (docs/benchmarks.md)
attack: deps-test build/quotagate build/asan/quotagate build/attack_slowloris
	@QG_BIN=build/quotagate bench/attack_slowloris.sh
	@QG_BIN=build/asan/quotagate bench/attack_slowloris.sh

build/attack_slowloris: bench/attack_slowloris.c
	@mkdir -p $(dir $@)
	$(CC) $(OPTB_FLAGS) -o $@ $< -lpthread

clean:
	rm -rf build

# the history reads of a subject with millions of rows, SQLite and
# PostgreSQL (docs/benchmarks.md "History"); starts its own PostgreSQL 15
build/bench_history: bench/bench_history.c build/obj/tests/support/pgproc.o \
                     build/obj/tests/support/ports.o build/libquotagate.a
	$(CC) $(OPTB_FLAGS) $(INC_all) -O2 -o $@ $^ $(LIBS)
